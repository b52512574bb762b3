"""The model record meets the config: the record a training run writes into its checkpoints
(``training_record``), and what a run of a model file (eval, predict, export) takes from the
file's record (``resolve_model``): a command-line value that contradicts the record is refused
naming both, one that it lacks fills it. Nothing here writes into the config object: the
result is a new ``ModelRecord`` and a new ``Config`` (``model_config``).
See docs/layout.md#the-task-and-the-model-record.
"""
import logging

from src.data.class_names import model_class_names
from src.data.settings import EvalPreprocess
from src.deploy.inference import load_network
from src.deploy.records import network_digest, read_model_record
from src.models.tta import TTA_MODES
from src.utils.checkpoint import pretrained_config
from src.utils.config import Config, ConfigError
from src.utils.hub import is_pretrained_source
from src.utils.model_record import ModelRecord, RecordError
from src.utils.tasks import get_task

LOGGER = logging.getLogger(__name__)

PREPROCESS_CONFIG_KEYS = {"image_size": "eval_image_size", "resize": "eval_resize",
                          "interpolation": "eval_interpolation"}
"""The record's eval preprocessing fields -> their config keys."""
IDENTITY_KEYS = ("net_name", "class_num", "task")
"""What a model is: a value set that contradicts its record is refused."""
LOSS_SETTINGS = {"asl": ("asl_gamma_neg", "asl_gamma_pos", "asl_clip"), "ce": (), "bce": ()}
"""The loss settings a record keeps besides its name (and ``label_smoothing``, ``pos_weight``)."""


def training_record(cfg: Config, class_names, loss_kwargs: dict | None = None) -> ModelRecord:
    """The record of the model a training run writes (every checkpoint, the best ones too):
    network, classes and their names, task, eval preprocessing, test-time augmentation and the
    loss (``loss_kwargs`` of ``create_loss``; ``class_weights`` become ``pos_weight`` of a
    multi-label BCE)."""
    kwargs = loss_kwargs or {}
    loss = {"loss": cfg.loss, "label_smoothing": cfg.label_smoothing}
    loss.update({key: cfg[key] for key in LOSS_SETTINGS.get(cfg.loss, ())})
    weights = kwargs.get("class_weights")
    if weights is not None:
        loss["pos_weight" if get_task(cfg.task).multi_hot else "class_weights"] = [
            float(v) for v in weights]
    return ModelRecord(net_name=cfg.net_name, class_num=cfg.class_num,
                       class_names=tuple(class_names) if class_names else None, task=cfg.task,
                       tta=cfg.tta, loss=loss,
                       preprocess={field: cfg[key] for field, key in
                                   PREPROCESS_CONFIG_KEYS.items()})


def checkpoint_digest(cfg: Config):
    """``(ModelRecord) -> str``: the SHA-256 of the weights ``cfg.checkpoint_path`` is run with
    (EMA by ``use_ema``), its network built as the record (else the config) says."""
    def digest(record: ModelRecord) -> str:
        net = load_network(record.net_name or cfg.net_name, record.class_num or cfg.class_num,
                           cfg.checkpoint_path, use_ema=cfg.use_ema,
                           stem_pool_pad_mode=cfg.stem_pool_pad_mode)
        return network_digest(net)
    return digest


def recorded_model(cfg: Config) -> ModelRecord:
    """The record of ``cfg.checkpoint_path`` (``read_model_record``); for Hub weights with
    the network, class count and eval preprocessing their tensors and ``config.json`` give
    (``pretrained_config``), and their ``tta`` checked."""
    source = cfg.checkpoint_path
    record = read_model_record(source, digest_of=checkpoint_digest(cfg))
    if is_pretrained_source(source):
        values = pretrained_config(source, cfg.user_value("net_name"))
        preprocess = {field: values[key] for field, key in PREPROCESS_CONFIG_KEYS.items()
                      if key in values}
        record = record.filled(ModelRecord(net_name=values["net_name"],
                                           class_num=values.get("class_num"),
                                           preprocess=preprocess or None))
    if record.tta is not None and record.tta not in TTA_MODES:
        raise RecordError(f"{record.source or source}: tta {record.tta!r} is not one of "
                          f"{', '.join(TTA_MODES)}")
    return record


def resolve_model(cfg: Config) -> ModelRecord:
    """The model a run of ``cfg.checkpoint_path`` runs: its record, the config's values for
    what it does not record; a ``net_name``, ``class_num`` or ``task`` set that contradicts
    the record is refused, as is another ``tta`` than an exported graph holds; set eval
    preprocessing keys and a ``.ckpt``'s ``tta`` override the record (logged). Class names:
    the record's, else ``model_class_names`` (``class_names_path``, ``class_names.txt``
    beside the checkpoint, ImageNet's at 1000 classes).

    Raises:
        ConfigError: For a contradiction (names both values and the file).
        RecordError: For a malformed record or ``class_names_path`` names other than the
            record's.
    """
    source = cfg.checkpoint_path
    recorded = recorded_model(cfg)
    where = recorded.source or source
    for key in IDENTITY_KEYS:
        user, own = cfg.user_value(key), getattr(recorded, key)
        if user is not None and own is not None and user != own:
            raise ConfigError(f"{key} {user}: {where} is a {own} model (its record says "
                              f"{key} {own}); pass --{key} {own}, or give a {user} model"
                              if key == "task" else
                              f"{key} {user}: {where} records {key} {own}; pass --{key} "
                              f"{own} or leave {key} unset")
    user_tta = cfg.user_value("tta")
    graph = source.endswith((".onnx", ".mindir"))
    if graph and recorded.tta is not None and user_tta not in (None, recorded.tta):
        raise ConfigError(f"tta {user_tta}: {source} was exported with tta {recorded.tta}, "
                          f"which is in its graph and cannot be changed; run it with tta "
                          f"{recorded.tta}, or export the checkpoint again with --tta {user_tta}")
    preprocess = {field: cfg[key] if key in cfg.user_keys or not recorded.preprocess
                  or field not in recorded.preprocess else recorded.preprocess[field]
                  for field, key in PREPROCESS_CONFIG_KEYS.items()}
    net_name = recorded.net_name or cfg.net_name
    class_num = recorded.class_num or cfg.class_num
    names = recorded.class_names
    given = model_class_names(source, class_num, cfg.class_names_path) if (
        cfg.class_names_path or names is None) else None
    if names is not None and given is not None and tuple(given) != names:
        raise RecordError(f"class_names_path {cfg.class_names_path} lists other class names "
                          f"than {where} records ({list(given)[:6]} against {list(names)[:6]})"
                          f": leave class_names_path empty, or give the file of this model")
    model = recorded.with_values(
        net_name=net_name, class_num=class_num, class_names=names or given,
        task=recorded.task or cfg.task,
        tta=recorded.tta if graph or user_tta is None and recorded.tta else cfg.tta,
        preprocess=preprocess, source=where)
    taken = {k: v for k, v in model_config_values(model).items()
             if k not in cfg.user_keys and k in model_config_values(recorded)}
    if taken:
        LOGGER.info("%s: taken from its record: %s", source,
                    ", ".join(f"{k} {v}" for k, v in taken.items()))
    return model


def model_config_values(model: ModelRecord) -> dict:
    """The config keys of a model's recorded values: network, class count, task, tta, eval
    preprocessing (those it records)."""
    values = {key: getattr(model, key) for key in (*IDENTITY_KEYS, "tta")
              if getattr(model, key) is not None}
    values.update({key: model.preprocess[field] for field, key in PREPROCESS_CONFIG_KEYS.items()
                   if model.preprocess and field in model.preprocess})
    return values


def model_config(cfg: Config, model: ModelRecord) -> Config:
    """A new ``Config``: ``cfg`` with the keys of the resolved ``model``
    (``model_config_values``); ``cfg`` itself is left as it was."""
    return cfg.replaced(**model_config_values(model))


def model_preprocess(cfg: Config, model: ModelRecord) -> EvalPreprocess:
    """The eval preprocessing of a resolved ``model`` (``exif_transpose`` from ``cfg``)."""
    return EvalPreprocess(**(model.preprocess or {}), exif_transpose=cfg.exif_transpose)


def weights_config(cfg: Config, source: str, eval_settings: bool = True) -> Config:
    """A new config for training from Hub weights ``source`` (``pre_trained``): the keys the
    user did not set take the weights' values (``pretrained_config``: their network; with
    ``eval_settings`` also class count and eval preprocessing), in one log line
    (``Config.with_unset``); for other sources ``cfg`` itself. ``cfg`` is unchanged.

    Raises:
        UserError: As ``pretrained_config`` (weights that cannot be read).
    """
    if not is_pretrained_source(source):
        return cfg
    return cfg.with_unset(pretrained_config(source, cfg.user_value("net_name"),
                                            eval_settings=eval_settings), source)


def check_teacher_classes(cfg: Config, class_names) -> None:
    """``kd_teacher``: its recorded class names must be the student's ``class_names`` (the
    training data's), in the same order; a teacher that records none gets one log line.

    Raises:
        ConfigError: If the names or their order differ (names both).
    """
    if not cfg.kd_teacher:
        return
    teacher = read_model_record(cfg.kd_teacher)
    if teacher.class_names is None:
        LOGGER.info("kd_teacher %s records no class names: its classes are taken to be the "
                    "training data's, in their order", cfg.kd_teacher)
        return
    if tuple(teacher.class_names) != tuple(class_names):
        differ = [f"{i}: {a} / {b}" for i, (a, b) in
                  enumerate(zip(teacher.class_names, class_names)) if a != b][:5]
        raise ConfigError(
            f"kd_teacher {cfg.kd_teacher} was trained on other classes than data_path's "
            f"(label: teacher / data: {', '.join(differ) or 'a different count'}): class i "
            f"would be distilled into another class; give a teacher of these classes in "
            f"this order")

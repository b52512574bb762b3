"""What a run of a model file (eval, predict, export) reads back from the model's own record:
Hub weights' ``config.json`` under the keys the user left unset, the ``tta`` of an exported
graph, the model's ``task``.
"""
from src.data.settings import EvalPreprocess
from src.deploy.formats import TTA_KEY, recorded_outputs, recorded_tta
from src.models.tta import TTA_MODES
from src.recipe.data import eval_preprocess
from src.utils.checkpoint import pretrained_config
from src.utils.config import Config, ConfigError
from src.utils.hub import is_pretrained_source, resolve_weights


def fill_from_weights(cfg: Config, source: str, eval_settings: bool = True) -> None:
    """Hub weights ``source``: the keys the user did not set take the weights' values
    (``pretrained_config``), logged by ``Config.fill_unset``; other sources: nothing."""
    if is_pretrained_source(source):
        cfg.fill_unset(pretrained_config(source, cfg.user_value("net_name"),
                                         eval_settings=eval_settings), source)


def resolve_eval_preprocess(cfg: Config, source: str) -> EvalPreprocess:
    """The eval preprocessing of a run of the weights ``source``: the config's, the keys the
    user left unset taken from Hub weights' ``config.json`` (``fill_from_weights``), as
    timm's ``resolve_data_config``. Once per entry point (eval, predict, export)."""
    fill_from_weights(cfg, source)
    return eval_preprocess(cfg)


def resolve_tta(cfg: Config) -> str:
    """``cfg.tta`` for a run of ``cfg.checkpoint_path`` (eval, predict, export), after the
    model's own record: Hub weights' ``config.json`` ``tta`` is taken unless the user set
    ``tta``; an exported graph runs as exported (``recorded_tta``), taken unless set, and a
    different value set is refused. docs/deployment.md#test-time-augmentation.

    Raises:
        ConfigError: If the user set another ``tta`` than an exported graph holds.
        WeightsConfigError: If the weights' ``config.json`` has a ``tta`` not in ``TTA_MODES``.
    """
    source = cfg.checkpoint_path
    if is_pretrained_source(source):
        weights = resolve_weights(source)
        recorded = weights.config.get(TTA_KEY, TTA_MODES[0])
        if recorded not in TTA_MODES:
            raise weights.field_error(TTA_KEY, recorded, f"one of {', '.join(TTA_MODES)}")
    else:
        recorded = recorded_tta(source)
        user = cfg.user_value("tta")
        if recorded is not None and user not in (None, recorded):
            raise ConfigError(f"tta {user}: {source} was exported with tta {recorded}, which "
                              f"is in its graph and cannot be changed; run it with tta "
                              f"{recorded}, or export the checkpoint again with --tta {user}")
    if recorded is not None and recorded != cfg.tta:
        cfg.fill_unset({"tta": recorded}, source)
    return cfg.tta


def resolve_task(cfg: Config) -> str:
    """``cfg.task`` for a run of ``cfg.checkpoint_path`` (eval, predict, export): the user's
    ``task`` if set, else the model's record (``recorded_outputs``: an exported graph's
    metadata, Hub weights' ``problem_type``, ``thresholds.json`` beside a ``.ckpt`` or its
    stored run config). docs/deployment.md#multi-label-models.

    Raises:
        ConfigError: If the user set another ``task`` than the model records (names both).
    """
    record = recorded_outputs(cfg.checkpoint_path, cfg.class_num)
    if record is None or record.task is None:
        return cfg.task
    user = cfg.user_value("task")
    if user not in (None, record.task):
        raise ConfigError(f"task {user}: {record.source} is a {record.task} model (its "
                          f"record says so); pass --task {record.task}, or give a "
                          f"{user} model")
    if record.task != cfg.task:
        cfg.fill_unset({"task": record.task}, record.source)
    return cfg.task

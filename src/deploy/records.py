"""The model record (``src.utils.model_record.ModelRecord``) in and out of every model file:
``read_model_record`` reads it back from any artifact (a ``.ckpt``, an ONNX or MindIR file, a
SAFETENSORS folder or Hub id, with what older and foreign files carry), ``write_model_record``
writes it into an exported file's native place, ``hub_config`` into a ``config.json``. Tuned
values (thresholds, an OOD threshold) belong to weights: ``thresholds.json`` beside a checkpoint
keeps them by the SHA-256 of the weights they were tuned on, and a checkpoint takes only its own.
See docs/deployment.md#the-model-record.
"""
import json
import logging
import os
from collections.abc import Sequence

from src.deploy.exporting import mindir_metadata, onnx_metadata, record_mindir, record_onnx
from src.models.tta import TTA_MODES
from src.utils.checkpoint import read_stored_config, stored_record_text
from src.utils.files import atomic_write_text
from src.utils.hub import is_pretrained_source, resolve_weights
from src.utils.model_record import (
    RECORD_KEY,
    ModelRecord,
    RecordError,
    from_dict,
    from_json,
    weights_digest,
)
from src.utils.multilabel_metrics import DEFAULT_THRESHOLD
from src.utils.tasks import MULTILABEL, TASKS

LOGGER = logging.getLogger(__name__)

THRESHOLDS_FILE = "thresholds.json"
"""Beside a checkpoint: ``{"task", "class_names", "tuned": [{"weights_sha256", "checkpoint",
and the ``TUNED_FIELDS`` tuned}, ...]}``, one entry per tuned set of weights."""
TUNED_FIELDS = ("thresholds", "ood_score", "ood_threshold", "temperature")
"""The record's fields tuned on weights (eval.py ``--tune_thresholds``, ``--tune_ood``,
``--calibrate temperature``)."""
UNTUNED = {"thresholds": "0.5 for every class", "ood_threshold": "no out-of-distribution "
                                                                  "threshold",
           "temperature": "no temperature (T = 1)"}
"""What a record uses for a field that is not tuned (in the warnings)."""
LEGACY_KEYS = ("task", "thresholds", "label_names", "tta")
"""The flat metadata keys of graphs exported before the record (read, no longer written)."""
METADATA_READERS = {".onnx": onnx_metadata, ".mindir": mindir_metadata}
METADATA_WRITERS = {"ONNX": record_onnx, "MINDIR": record_mindir}


def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def read_model_record(path: str, *, digest_of=None) -> ModelRecord:
    """The record of the model file ``path`` (empty: ``ModelRecord()``).

    Args:
        path (str): A ``.ckpt``, ``.onnx``, ``.mindir``, Hub id, SAFETENSORS folder or file.
        digest_of (callable, optional): ``(ModelRecord) -> str``, the SHA-256 of the
            weights a ``.ckpt`` is run with, given its stored record (``network_digest``);
            called only when a ``thresholds.json`` lies beside it, whose entry of that digest
            is taken.

    Raises:
        RecordError: For a malformed record or thresholds file (names the file and field).
        MissingFileError, CheckpointError, HubError: If the file cannot be read.
    """
    if not path:
        return ModelRecord()
    if is_pretrained_source(path):
        return hub_record(path)
    suffix = _suffix(path)
    if suffix in METADATA_READERS:
        return metadata_record(path)
    if suffix != ".ckpt" or not os.path.isfile(path):
        return ModelRecord(source=path)  # the loader names a missing file
    text = stored_record_text(path)
    if text is not None:
        record = from_json(text, source=path)
    else:  # written before the record: the task of its run config, if any
        task = (read_stored_config(path) or {}).get("task")
        record = ModelRecord(task=task if task in TASKS else None, source=path)
    return tuned_values(path, record, digest_of)


def metadata_record(path: str) -> ModelRecord:
    """The record of an exported graph's metadata (``RECORD_KEY``; older files: the flat
    ``LEGACY_KEYS``, the class count their names or thresholds give).

    Raises:
        RecordError: If the metadata is malformed, or the file cannot be read as its format.
    """
    from google.protobuf.message import DecodeError

    if not os.path.isfile(path):
        return ModelRecord(source=path)
    try:
        metadata = METADATA_READERS[_suffix(path)](path)
    except (OSError, DecodeError):
        return ModelRecord(source=path)  # the loader says why
    if RECORD_KEY in metadata:
        return from_json(metadata[RECORD_KEY], source=path)
    values = {}
    for key in LEGACY_KEYS:
        if key in metadata:
            try:
                values[key] = (json.loads(metadata[key]) if key in ("thresholds", "label_names")
                               else metadata[key])
            except json.JSONDecodeError as err:
                raise RecordError(f"{path}: its {key} metadata is not JSON ({err})") from err
    values["task"] = values.get("task", next(iter(TASKS)))
    values["class_names"] = values.pop("label_names", None)
    counted = values["class_names"] or values.get("thresholds")
    values["class_num"] = len(counted) if isinstance(counted, list) else None
    values["tta"] = values.get("tta", "none")
    return from_dict(values, source=path)


def hub_record(source: str) -> ModelRecord:
    """The record of Hub weights (an ``hf-hub:`` id, a SAFETENSORS folder or file): the
    ``RECORD_KEY`` object of its ``config.json`` when written by this package, checked against
    timm's keys there; else what timm's keys carry (architecture, class count, label names,
    ``problem_type``, thresholds, ``tta``).

    Raises:
        RecordError, WeightsConfigError: For a malformed record or one that contradicts
            timm's keys of the same file (names both).
    """
    weights = resolve_weights(source)
    config = weights.config
    where = f"{source} ({weights.config_file})"
    if config.get("tta", TTA_MODES[0]) not in TTA_MODES:
        raise weights.field_error("tta", config["tta"], f"one of {', '.join(TTA_MODES)}")
    timm = ModelRecord(
        net_name=config.get("architecture") if isinstance(config.get("architecture"), str)
        else None,
        class_num=config.get("num_classes") if isinstance(config.get("num_classes"), int)
        else None,
        class_names=weights.label_names, task=weights.task, thresholds=weights.thresholds,
        tta=config.get("tta"), source=where)
    if RECORD_KEY not in config:
        return from_dict(timm.recorded(), source=where)
    record = from_dict(config[RECORD_KEY], source=where)
    for name in ("net_name", "class_num", "class_names", "task"):
        ours, theirs = getattr(record, name), getattr(timm, name)
        if ours is not None and theirs is not None and ours != theirs:
            raise RecordError(f"{where}: its {RECORD_KEY} says {name} {_shown(ours)} but timm's "
                              f"keys say {_shown(theirs)}: the file was edited; correct one")
    return record


def _shown(value) -> str:
    if isinstance(value, tuple | list) and len(value) > 6:
        return f"[{', '.join(map(repr, value[:6]))}, ... ({len(value)})]"
    return repr(list(value) if isinstance(value, tuple) else value)


def write_model_record(path: str, file_format: str, record: ModelRecord) -> None:
    """Write ``record`` into an exported file of ``file_format``, in place: ONNX
    ``metadata_props`` / MindIR ``user_info`` under ``RECORD_KEY`` (JSON text); nothing for
    a format without metadata (AIR). A SAFETENSORS folder takes it in ``hub_config``."""
    writer = METADATA_WRITERS.get(file_format)
    if writer is not None:
        writer(path, {RECORD_KEY: record.to_json()})


def hub_config(timm_config: dict, record: ModelRecord) -> dict:
    """``config.json``: timm's keys (``timm_config``) plus ``problem_type`` (Hugging Face's
    name of the task), a multi-label model's ``thresholds`` (its record's, else 0.5 each),
    ``tta`` and ``RECORD_KEY``."""
    config = dict(timm_config)
    task = record.task_object
    if record.task is not None:
        config["problem_type"] = task.problem_type
    if task.uses_thresholds:
        config["thresholds"] = (list(record.thresholds) if record.thresholds is not None
                                else [DEFAULT_THRESHOLD] * (record.class_num or 0))
    if record.tta not in (None, "none"):
        config["tta"] = record.tta
    config[RECORD_KEY] = record.to_dict()
    return config



# ---- thresholds.json: tuned values by the weights they were tuned on ----

def network_digest(net) -> str:
    """The SHA-256 of a loaded network's parameters (``weights_digest``): what tuned
    thresholds record as the weights they belong to (the EMA's when it was loaded)."""
    return weights_digest({p.name: p for p in net.get_parameters()})


def thresholds_path(checkpoint_path: str) -> str:
    """``thresholds.json`` beside a checkpoint file."""
    return os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), THRESHOLDS_FILE)


def _read_thresholds_file(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"cannot read {path} as JSON: {err}") from err
    if not isinstance(content, dict) or content.get("task") not in TASKS \
            or not isinstance(content.get("class_names"), list):
        raise RecordError(f"{path}: expected a JSON object with a task ({', '.join(TASKS)}), "
                          f"class_names and tuned values (written by eval.py "
                          f"--tune_thresholds, --tune_ood or --calibrate temperature)")
    return content


def _untuned(record: ModelRecord, names) -> str:
    """What a record without tuned values uses instead, for the ``names`` a file tunes."""
    return ", ".join(f"its own recorded {name}" if getattr(record, name) is not None
                     else UNTUNED[name] for name in UNTUNED if name in names) or "nothing tuned"


def tuned_values(checkpoint_path: str, record: ModelRecord, digest_of) -> ModelRecord:
    """``record`` with the values (``TUNED_FIELDS``) ``thresholds.json`` beside
    ``checkpoint_path`` holds for its weights (the entry whose ``weights_sha256`` is
    ``digest_of(record)``). A file without such an entry (tuned on other weights, or written
    before thresholds named their weights) is not applied: one warning names it and what is
    used instead.

    Raises:
        RecordError: If the file is malformed, or its task or class names are not the
            record's (names both), or a value is malformed (as ``ModelRecord``'s checks).
    """
    path = thresholds_path(checkpoint_path)
    if not os.path.isfile(path):
        return record
    content = _read_thresholds_file(path)
    names, task = tuple(content["class_names"]), content["task"]
    if record.class_names is not None and names != record.class_names \
            or record.task not in (None, task):
        raise RecordError(f"{path} was tuned for a {task} model of the classes {_shown(names)} "
                          f"but {checkpoint_path} records a {record.task} model of "
                          f"{_shown(record.class_names)}: tune again on this checkpoint")
    if record.class_num is not None and len(names) != record.class_num:
        raise RecordError(f"{path} lists {len(names)} class names but {checkpoint_path} has "
                          f"{record.class_num} classes")
    entries = content.get("tuned")
    if not isinstance(entries, list):
        LOGGER.warning("%s holds thresholds of unknown weights (no weights_sha256: written "
                       "before thresholds named their weights); not applied to %s, which uses "
                       "%s: tune again with eval.py --tune_thresholds true", path,
                       checkpoint_path, _untuned(record, ["thresholds"]))
        return record
    digest = digest_of(record) if digest_of is not None else None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("weights_sha256") == digest:
            return record.with_values(**{k: entry[k] for k in TUNED_FIELDS if k in entry},
                                      thresholds_weights=digest, task=task,
                                      class_names=record.class_names or names,
                                      class_num=record.class_num or len(names),
                                      source=f"{checkpoint_path} ({path})")
    entries = [e for e in entries if isinstance(e, dict)]
    tuned_on = ", ".join(str(e.get("checkpoint")) for e in entries)
    LOGGER.warning("%s holds values tuned on other weights (%s); %s has other weights and "
                   "uses %s", path, tuned_on or "none", checkpoint_path,
                   _untuned(record, {k for e in entries for k in e}))
    return record


def write_tuned_values(checkpoint_path: str, class_names: Sequence[str], values: dict,
                       digest: str, *, task: str) -> str:
    """Record ``values`` (fields of ``TUNED_FIELDS``) tuned on the weights of SHA-256
    ``digest`` of a ``task`` model in ``thresholds.json`` beside ``checkpoint_path``,
    atomically: merged into that weights' entry, the entries of other weights kept; returns
    its path.

    Raises:
        RecordError: If a value is malformed (``ModelRecord``'s checks), or an existing file
            is of another task or other class names.
        WriteError: If it cannot be written.
    """
    from_dict({"class_num": len(class_names), "class_names": list(class_names), "task": task,
               **values}, source=THRESHOLDS_FILE)
    path = thresholds_path(checkpoint_path)
    entries, own = [], {}
    if os.path.isfile(path):
        try:
            content = _read_thresholds_file(path)
        except RecordError:
            content = {}
        if content and (content["class_names"] != list(class_names) or content["task"] != task):
            raise RecordError(f"{path} holds values for a {content['task']} model of the classes "
                              f"{_shown(content['class_names'])}, not a {task} one of "
                              f"{_shown(list(class_names))}: move it away first")
        for entry in content.get("tuned", []):
            if isinstance(entry, dict) and entry.get("weights_sha256") == digest:
                own = entry
            elif isinstance(entry, dict):
                entries.append(entry)
    entries.append({**own, "weights_sha256": digest,
                    "checkpoint": os.path.basename(checkpoint_path), **values})
    atomic_write_text(path, json.dumps({"task": task, "class_names": list(class_names),
                                        "tuned": entries}, indent=1) + "\n")
    return path


def write_tuned_thresholds(checkpoint_path: str, class_names: Sequence[str], thresholds,
                           digest: str) -> str:
    """``write_tuned_values`` of a multi-label model's ``thresholds`` (one per class, in
    [0, 1])."""
    return write_tuned_values(checkpoint_path, class_names,
                              {"thresholds": [float(v) for v in thresholds]}, digest,
                              task=MULTILABEL.name)

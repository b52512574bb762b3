"""The model record (``src.utils.model_record.ModelRecord``) in and out of every model file:
``read_model_record`` reads it back from any artifact (a ``.ckpt``, an ONNX or MindIR file, a
SAFETENSORS folder or Hub id, with what older and foreign files carry), ``write_model_record``
writes it into an exported file's native place, ``hub_config`` into a ``config.json``. Tuned
values belong to weights: ``thresholds.json`` (a multi-label model's thresholds) and
``calibration.json`` (a single-label model's temperature) beside a checkpoint keep them by the
SHA-256 of the weights they were tuned on (``TunedValues``), and a checkpoint takes only its
own.
See docs/deployment.md#the-model-record.
"""
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

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
from src.utils.tasks import MULTICLASS, MULTILABEL, TASKS, Task

LOGGER = logging.getLogger(__name__)

THRESHOLDS_FILE = "thresholds.json"
"""Beside a checkpoint: a multi-label model's thresholds by the weights they were tuned on."""
CALIBRATION_FILE = "calibration.json"
"""Beside a checkpoint: a single-label model's temperature by the weights it was fitted on."""
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
            called only when a file of ``TUNED_FILES`` lies beside it, whose entry of that
            digest is taken.

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



# ---- tuned values by the weights they were tuned on: thresholds.json, calibration.json ----

@dataclass(frozen=True, kw_only=True)
class TunedValues:
    """Record fields tuned on a checkpoint's weights, kept in a JSON file beside it:
    ``{"task", "class_names", "tuned": [{"weights_sha256", "checkpoint", FIELD: value, ...}]}``,
    one entry per set of weights; a checkpoint takes only the entry of its own weights."""

    file: str  # the file's name beside the checkpoint
    task: Task  # the task of the models it serves
    field: str  # the ModelRecord field an entry sets
    what: str  # the values, in messages
    verb: str  # how they were made, in messages
    redo: str  # how to make them again, in messages
    command: str  # what writes the file
    fallback: str  # what a model without them uses, in messages
    weights_field: str | None = None  # the record field given the weights' SHA-256

    def default(self, record: ModelRecord) -> str:
        """What ``record`` uses without an entry, in messages."""
        own = getattr(record, self.field) is not None
        return f"its own recorded {self.field}" if own else self.fallback

THRESHOLDS = TunedValues(file=THRESHOLDS_FILE, task=MULTILABEL, field="thresholds",
                         what="thresholds", verb="tuned", redo="tune",
                         command="eval.py --tune_thresholds true",
                         fallback="0.5 for every class", weights_field="thresholds_weights")
CALIBRATION = TunedValues(file=CALIBRATION_FILE, task=MULTICLASS, field="temperature",
                          what="a temperature", verb="fitted", redo="fit",
                          command="eval.py --calibrate temperature",
                          fallback="no temperature (T = 1)")
TUNED_FILES = (THRESHOLDS, CALIBRATION)
"""The files of tuned values ``read_model_record`` applies to a ``.ckpt``."""


def network_digest(net) -> str:
    """The SHA-256 of a loaded network's parameters (``weights_digest``): what tuned
    values record as the weights they belong to (the EMA's when it was loaded)."""
    return weights_digest({p.name: p for p in net.get_parameters()})


def tuned_path(checkpoint_path: str, kind: TunedValues) -> str:
    """The file of ``kind`` beside a checkpoint file."""
    return os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), kind.file)

def _read_tuned_file(path: str, kind: TunedValues) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"cannot read {path} as JSON: {err}") from err
    if not isinstance(content, dict) or content.get("task") != kind.task.name \
            or not isinstance(content.get("class_names"), list):
        raise RecordError(f"{path}: expected a JSON object with task {kind.task.name}, "
                          f"class_names and tuned {kind.field} (written by {kind.command})")
    return content


def tuned_values(checkpoint_path: str, record: ModelRecord, digest_of) -> ModelRecord:
    """``record`` with the values every file of ``TUNED_FILES`` beside ``checkpoint_path``
    holds for its weights (``apply_tuned``); the digest is computed once, if a file exists."""
    digests = {}

    def digest(_: ModelRecord) -> str | None:  # of the weights, whatever a file has filled
        if "sha256" not in digests:
            digests["sha256"] = digest_of(record) if digest_of is not None else None
        return digests["sha256"]
    for kind in TUNED_FILES:
        record = apply_tuned(kind, checkpoint_path, record, digest)
    return record


def apply_tuned(kind: TunedValues, checkpoint_path: str, record: ModelRecord,
                digest_of) -> ModelRecord:
    """``record`` with the ``kind.field`` the file of ``kind`` beside ``checkpoint_path``
    holds for its weights (the entry whose ``weights_sha256`` is ``digest_of(record)``). A
    file without such an entry (tuned on other weights, or written before entries named their
    weights) is not applied: one warning names it and what is used instead.

    Raises:
        RecordError: If the file is malformed, or its class names are not the record's
            (names both), or its values are malformed (names the file and field).
    """
    path = tuned_path(checkpoint_path, kind)
    if not os.path.isfile(path):
        return record
    content = _read_tuned_file(path, kind)
    names = tuple(content["class_names"])
    if record.class_names is not None and names != record.class_names:
        raise RecordError(f"{path} was {kind.verb} for the classes {_shown(names)} but "
                          f"{checkpoint_path} records {_shown(record.class_names)}: "
                          f"{kind.redo} again on this checkpoint "
                          f"({kind.command})")
    if record.class_num is not None and len(names) != record.class_num:
        raise RecordError(f"{path} lists {len(names)} class names but {checkpoint_path} has "
                          f"{record.class_num} classes")
    entries = content.get("tuned")
    if not isinstance(entries, list):
        LOGGER.warning("%s holds %s of unknown weights (no weights_sha256: written before "
                       "entries named their weights); not applied to %s, which uses %s: "
                       "%s again with %s", path, kind.what, checkpoint_path,
                       kind.default(record), kind.redo, kind.command)
        return record
    digest = digest_of(record) if digest_of is not None else None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("weights_sha256") == digest:
            if record.task is not None and record.task != kind.task.name:
                raise RecordError(f"{path} holds {kind.what} for {checkpoint_path}'s weights, "
                                  f"for a {kind.task.name} model, but it records task "
                                  f"{record.task}: move {path} away")
            extra = {kind.weights_field: digest} if kind.weights_field else {}
            tuned = record.with_values(**{kind.field: entry.get(kind.field)}, **extra,
                                       task=kind.task.name,
                                       class_names=record.class_names or names,
                                       class_num=record.class_num or len(names),
                                       source=f"{checkpoint_path} ({path})")
            LOGGER.info("%s: %s %s from %s (%s on its weights)", checkpoint_path, kind.field,
                        _shown(getattr(tuned, kind.field)), path, kind.verb)
            return tuned
    tuned_on = ", ".join(str(e.get("checkpoint")) for e in entries if isinstance(e, dict))
    LOGGER.warning("%s holds %s %s on other weights (%s); %s has other weights and uses %s",
                   path, kind.what, kind.verb, tuned_on or "none", checkpoint_path,
                   kind.default(record))
    return record


def tuned_thresholds(checkpoint_path: str, record: ModelRecord, digest_of) -> ModelRecord:
    """``apply_tuned`` of ``thresholds.json``."""
    return apply_tuned(THRESHOLDS, checkpoint_path, record, digest_of)


def write_tuned(kind: TunedValues, checkpoint_path: str, class_names: Sequence[str], value,
                digest: str, *, about: dict | None = None) -> str:
    """Record ``value`` of ``kind.field`` (thresholds: one per class in [0, 1]; temperature: a
    number above 0), tuned on the weights of SHA-256 ``digest``, in the file of ``kind``
    beside ``checkpoint_path``, atomically, keeping the entries of other weights; ``about``:
    more keys of the entry (what it was tuned on). Returns the file's path.

    Raises:
        RecordError: If ``value`` is malformed, an existing file has other class names, or
            the counts differ.
        WriteError: If it cannot be written.
    """
    value = [float(v) for v in value] if kind.field == "thresholds" else float(value)
    from_dict({"class_num": len(class_names), "class_names": list(class_names),
               kind.field: value}, source=kind.file)
    path = tuned_path(checkpoint_path, kind)
    entries = []
    if os.path.isfile(path):
        try:
            content = _read_tuned_file(path, kind)
        except RecordError:
            content = {}
        if content and content["class_names"] != list(class_names):
            raise RecordError(f"{path} holds {kind.what} for the classes "
                              f"{_shown(content['class_names'])}, not "
                              f"{_shown(list(class_names))}: move it away first")
        entries = [e for e in content.get("tuned", []) if isinstance(e, dict)
                   and e.get("weights_sha256") != digest]
    entries.append({"weights_sha256": digest, "checkpoint": os.path.basename(checkpoint_path),
                    kind.field: value, **(about or {})})
    atomic_write_text(path, json.dumps({"task": kind.task.name,
                                        "class_names": list(class_names),
                                        "tuned": entries}, indent=1) + "\n")
    return path


def write_tuned_thresholds(checkpoint_path: str, class_names: Sequence[str], thresholds,
                           digest: str) -> str:
    """``write_tuned`` of ``thresholds.json``."""
    return write_tuned(THRESHOLDS, checkpoint_path, class_names, thresholds, digest)

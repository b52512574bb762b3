"""The model record: what a model file is (network, classes and their names, task, decision
thresholds and the weights they were tuned on, test-time augmentation, eval preprocessing,
the loss it was trained with), one frozen ``ModelRecord`` written into every checkpoint and
export and read back from each (``src.deploy.records``). As JSON it is a flat object of the
fields below; fields a file does not record are None.
See docs/layout.md#the-task-and-the-model-record.
"""
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from src.utils.errors import UserError
from src.utils.ood import OOD_SCORES
from src.utils.tasks import TASKS, get_task

RECORD_KEY = "model_record"
"""Its key in a ``.ckpt`` (a string entry), an ONNX ``metadata_props`` and a MindIR
``user_info`` (JSON text), and in a SAFETENSORS ``config.json`` (an object, beside timm's keys)."""
FORMAT_VERSION = 1
PREPROCESS_KEYS = ("image_size", "resize", "interpolation")
"""The eval preprocessing a record holds (``EvalPreprocess`` fields; mean and std: ImageNet's)."""


class RecordError(UserError, ValueError):
    """A model record is malformed, or does not agree with the model, the data or the command
    line (the message names both sides)."""


@dataclass(frozen=True)
class ModelRecord:
    """What a model file is. Every field may be None: not recorded (an older or foreign file).

    Attributes:
        net_name (str): ``resnet18`` .. ``resnet152``.
        class_num (int): Classifier outputs K.
        class_names (tuple[str, ...]): K names in label order.
        task (str): A key of ``src.utils.tasks.TASKS``.
        thresholds (tuple[float, ...]): K per-class decision thresholds in [0, 1] (multi-label).
        thresholds_weights (str): SHA-256 (hex) of the weights its tuned values (thresholds,
            OOD threshold) were tuned on (``weights_digest``); None for defaults or values of
            unknown weights.
        tta (str): Test-time augmentation (``none`` or ``flip``).
        preprocess (Mapping): Eval preprocessing: ``image_size``, ``resize`` (px),
            ``interpolation``.
        loss (Mapping): The training loss: ``loss`` (name) and its settings
            (``asl_gamma_neg``, ``asl_gamma_pos``, ``asl_clip``, ``pos_weight`` (K,) ...).
        temperature (float): Calibration temperature T > 0: probabilities of logits / T
            (``src.deploy.outputs.model_probabilities``; ``eval.py --calibrate temperature``).
        ood_score (str): The out-of-distribution score of ``ood_threshold`` (one of
            ``src.utils.ood.OOD_SCORES``, of the raw logits).
        ood_threshold (float): An image scoring below it is unknown (single-label only).
        source (str): Where it was read from, for messages (not part of equality).
    """

    net_name: str | None = None
    class_num: int | None = None
    class_names: tuple[str, ...] | None = None
    task: str | None = None
    thresholds: tuple[float, ...] | None = None
    thresholds_weights: str | None = None
    tta: str | None = None
    preprocess: Mapping[str, Any] | None = None
    loss: Mapping[str, Any] | None = None
    temperature: float | None = None
    ood_score: str | None = None
    ood_threshold: float | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("class_names", "thresholds"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        for name in ("preprocess", "loss"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, dict(value))

    def __hash__(self):
        return hash((self.net_name, self.class_num, self.class_names, self.task))

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (``format`` 1; ``source`` left out; None kept)."""
        out = {"format": FORMAT_VERSION}
        for f in fields(self):
            if f.name == "source":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def to_json(self) -> str:
        """``to_dict`` as compact JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def with_values(self, **values) -> "ModelRecord":
        """A copy with ``values`` replaced (checked as ``from_dict`` checks)."""
        return checked(replace(self, **values))

    def filled(self, other: "ModelRecord") -> "ModelRecord":
        """A copy whose unrecorded (None) fields take ``other``'s."""
        values = {f.name: getattr(other, f.name) for f in fields(self)
                  if f.name != "source" and getattr(self, f.name) is None}
        return checked(replace(self, **values))

    def recorded(self) -> dict[str, Any]:
        """The fields that are recorded (not None), ``source`` left out."""
        return {k: v for k, v in self.to_dict().items() if v is not None and k != "format"}

    @property
    def task_object(self):
        """The ``Task`` of ``task`` (the default task when not recorded)."""
        return get_task(self.task or next(iter(TASKS)))


def _fail(source: str, name: str, value: Any, expected: str) -> RecordError:
    return RecordError(f"{source or 'model record'}: field {name} is {value!r}; expected "
                       f"{expected}")


def _is_number(value) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def checked(record: ModelRecord) -> ModelRecord:
    """``record`` after its checks: types, ranges, counts agreeing with ``class_num``.

    Raises:
        RecordError: Naming the source, the field and what was expected.
    """
    src = record.source
    if record.class_num is not None and (not isinstance(record.class_num, int)
                                         or isinstance(record.class_num, bool)
                                         or record.class_num < 1):
        raise _fail(src, "class_num", record.class_num, "a whole number >= 1")
    if record.task is not None and record.task not in TASKS:
        raise _fail(src, "task", record.task, f"one of {', '.join(TASKS)}")
    if record.net_name is not None and not isinstance(record.net_name, str):
        raise _fail(src, "net_name", record.net_name, "a network name")
    for name in ("class_names", "thresholds"):
        value = getattr(record, name)
        if value is None:
            continue
        if record.class_num is not None and len(value) != record.class_num:
            raise RecordError(f"{src or 'model record'}: field {name} has {len(value)} values "
                              f"but class_num is {record.class_num}")
        if name == "class_names" and not all(isinstance(v, str) for v in value):
            raise _fail(src, name, list(value), "a list of class names (strings)")
        if name == "thresholds":
            bad = [v for v in value if not _is_number(v) or not 0 <= v <= 1]
            if bad:
                raise _fail(src, name, bad[0], "numbers in [0, 1], one per class")
    for name in ("temperature", "ood_threshold"):
        value = getattr(record, name)
        if value is not None and not _is_number(value):
            raise _fail(src, name, value, "a finite number")
    if record.temperature is not None and record.temperature <= 0:
        raise _fail(src, "temperature", record.temperature, "a number above 0")
    check_ood(record)
    if record.preprocess is not None:
        unknown = sorted(set(record.preprocess) - set(PREPROCESS_KEYS))
        if unknown:
            raise _fail(src, "preprocess", unknown[0], f"keys of {', '.join(PREPROCESS_KEYS)}")
    return record


def check_ood(record: ModelRecord) -> None:
    """``ood_score`` one of ``OOD_SCORES``, recorded with ``ood_threshold`` or not at all, and
    neither in a multi-label record (its scores are single-label ones).

    Raises:
        RecordError: Naming the source and the field.
    """
    src = record.source or "model record"
    if record.ood_score is not None and record.ood_score not in OOD_SCORES:
        raise _fail(src, "ood_score", record.ood_score, f"one of {', '.join(OOD_SCORES)}")
    if (record.ood_score is None) != (record.ood_threshold is None):
        raise RecordError(f"{src}: records ood_score {record.ood_score} and ood_threshold "
                          f"{record.ood_threshold}; expected both or neither")
    if record.ood_score is not None and record.task is not None \
            and get_task(record.task).multi_hot:
        raise _fail(src, "ood_score", record.ood_score, "none in a multilabel record (the "
                    "out-of-distribution scores are single-label ones)")


def from_dict(values: Mapping[str, Any], source: str = "") -> ModelRecord:
    """The record of ``to_dict``'s form; unknown keys (a later format's) are ignored.

    Raises:
        RecordError: If ``values`` is not an object or a field is malformed (names ``source``).
    """
    if not isinstance(values, Mapping):
        raise RecordError(f"{source or 'model record'}: expected a JSON object, got "
                          f"{type(values).__name__}")
    known = {f.name for f in fields(ModelRecord)} - {"source"}
    try:
        record = ModelRecord(**{k: v for k, v in values.items() if k in known}, source=source)
    except (TypeError, ValueError) as err:
        raise RecordError(f"{source or 'model record'}: {err}") from err
    return checked(record)


def from_json(text: str, source: str = "") -> ModelRecord:
    """``from_dict`` of JSON text.

    Raises:
        RecordError: If it is not JSON, or as ``from_dict``.
    """
    try:
        values = json.loads(text)
    except (TypeError, json.JSONDecodeError) as err:
        raise RecordError(f"{source or 'model record'}: not JSON ({err})") from err
    return from_dict(values, source)


def weights_digest(arrays: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of named weights: names sorted, each name, dtype, shape and bytes hashed;
    what thresholds record as the weights they were tuned on.

    Args:
        arrays (Mapping[str, array-like]): name -> numpy array (or anything with ``asnumpy``).
    """
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = arrays[name]
        array = np.ascontiguousarray(value.asnumpy() if hasattr(value, "asnumpy") else value)
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def differences(first: ModelRecord, second: ModelRecord,
                names: Iterable[str] = ("net_name", "class_num", "task", "class_names")
                ) -> list[str]:
    """The fields of ``names`` that both records hold with different values."""
    return [name for name in names if getattr(first, name) is not None
            and getattr(second, name) is not None and getattr(first, name) != getattr(second, name)]


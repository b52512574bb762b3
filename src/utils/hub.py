"""Pretrained weights in timm's Hugging Face Hub form (``model.safetensors`` + ``config.json``):
an ``hf-hub:ORG/NAME[@REVISION]`` id (downloaded once into the Hugging Face cache by
``huggingface_hub``), a folder holding both files, or a bare ``.safetensors`` file. Read with
safetensors' numpy loader, no PyTorch; ``config.json`` gives the architecture, class count,
label names and eval settings (``pretrained_cfg``). See docs/finetune.md#1-weights.
"""
import functools
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from src.utils.architectures import ARCHITECTURES
from src.utils.config import UPPER_BOUNDS
from src.utils.errors import MissingFileError, UserError
from src.utils.image_constants import IMAGENET_MEAN, IMAGENET_STD, INTERPOLATIONS
from src.utils.tasks import PROBLEM_TYPES

HUB_PREFIX = "hf-hub:"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SUFFIX = ".safetensors"
BUILT_ARCHITECTURES = tuple(ARCHITECTURES)
"""timm architectures whose weights this package's networks hold: torchvision's ResNets (one
7x7 stem convolution, stride on the 3x3 convolution of the bottleneck)."""
KNOWN_IDS = ("timm/resnet18.tv_in1k", "timm/resnet34.tv_in1k", "timm/resnet50.tv_in1k",
             "timm/resnet50.tv2_in1k", "timm/resnet101.tv2_in1k", "timm/resnet152.tv2_in1k",
             "timm/resnet50.a1_in1k")
"""Hub ids of ImageNet weights that fit (docs/finetune.md lists their top-1 and eval settings)."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubError(UserError):
    """Weights cannot be had from the named source (unknown id or revision, gated, offline
    without a cached copy, an incomplete download, a folder without the files)."""


class WeightsConfigError(UserError, ValueError):
    """A field of the weights' ``config.json`` has a wrong type or a value out of range."""


class PretrainedMismatchError(UserError, ValueError):
    """The weights are of a network this package does not build, or do not fit the config
    (``net_name``, normalization)."""


@dataclass(frozen=True)
class PretrainedWeights:
    """Weights resolved to local files: ``source`` as the user gave it, the local
    ``weights_file``, the parsed ``config.json`` (timm's; {} when there is none)."""

    source: str
    weights_file: str
    config: dict[str, Any] = field(default_factory=dict)
    config_file: str = CONFIG_FILE

    def field_error(self, name: str, value: Any, expected: str,
                    shown: bool = False) -> "WeightsConfigError":
        """The one-line error of ``config.json``'s field ``name`` (dotted) holding ``value``
        (its repr; with ``shown``, ``value`` is a description, printed as it is)."""
        return WeightsConfigError(f"{self.source}: {self.config_file} field {name} is "
                                  f"{value if shown else repr(value)}; expected {expected}")

    @property
    def pretrained_cfg(self) -> dict:
        """The weights' ``pretrained_cfg`` (timm): eval settings and provenance; {} if none.

        Raises:
            WeightsConfigError: If it is not a JSON object.
        """
        info = self.config.get("pretrained_cfg") or {}
        if not isinstance(info, dict):
            raise self.field_error("pretrained_cfg", info, "a JSON object (timm's pretrained_cfg)")
        return info

    @property
    def label_names(self) -> list[str] | None:
        """``config.json``'s ``label_names`` (class names in label order: timm writes a list,
        or a dict of class index "0".."N-1" -> name), or None.

        Raises:
            WeightsConfigError: For a name that is not a string, dict keys that are not the
                indices 0..N-1, or a count other than ``num_classes`` (names the file).
        """
        names = self.config.get("label_names")
        if not names:
            return None
        count = self.config.get("num_classes")
        count = count if isinstance(count, int) and not isinstance(count, bool) else len(names)
        if isinstance(names, dict):
            names = self._indexed_names(names, count)
        if not isinstance(names, list):
            raise self.field_error("label_names", names, "a list of class names, or a dict of "
                                   "class index -> name")
        bad = next((i for i, name in enumerate(names) if not isinstance(name, str)), None)
        if bad is not None:
            raise self.field_error(f"label_names[{bad}]", names[bad], "a class name (a string)")
        if len(names) != count:
            raise self.field_error("label_names", f"{len(names)} names", f"num_classes {count}",
                                   shown=True)
        return names

    @property
    def task(self) -> str | None:
        """The task of ``config.json``'s ``problem_type`` (``PROBLEM_TYPES``), None if absent.

        Raises:
            WeightsConfigError: For a problem type not in ``PROBLEM_TYPES``.
        """
        problem = self.config.get("problem_type")
        if problem is None:
            return None
        if problem not in PROBLEM_TYPES:
            raise self.field_error("problem_type", problem, f"one of {', '.join(PROBLEM_TYPES)}")
        return PROBLEM_TYPES[problem].name

    @property
    def thresholds(self) -> list | None:
        """``config.json``'s ``thresholds`` (a multi-label model's per-class decision
        thresholds, as written: checked by ``src.deploy.outputs``), or None."""
        return self.config.get("thresholds")

    def _indexed_names(self, names, count):
        """A dict of class index (timm's string keys) -> name as the list in index order."""
        key = next((k for k in names if not (k.isascii() and k.isdigit())), None)
        if key is not None:
            raise self.field_error("label_names", f"a dict with key {key!r}",
                                   'class indices "0".."N-1" as keys', shown=True)
        indices = {int(k): v for k, v in names.items()}
        missing = sorted(set(range(count)) - set(indices))
        extra = sorted(set(indices) - set(range(count)))
        if missing or extra or len(indices) != len(names):
            raise self.field_error(
                "label_names", f"a dict with keys {min(indices)}..{max(indices)} "
                f"({len(names)} names)", f"the class indices 0..{count - 1} (num_classes "
                f"{count}) as keys; missing {missing[:10]}, extra {extra[:10]}", shown=True)
        return [indices[i] for i in range(count)]


def is_pretrained_source(path: str) -> bool:
    """Whether ``path`` names weights in the Hub form (an ``hf-hub:`` id, a folder or a
    ``.safetensors`` file) rather than a ``.ckpt`` / exported model file."""
    return bool(path) and (path.startswith(HUB_PREFIX) or path.endswith(SUFFIX)
                           or os.path.isdir(path))


def parse_hub_id(source: str) -> tuple[str, str | None]:
    """``hf-hub:ORG/NAME[@REVISION]`` -> (``ORG/NAME``, revision or None).

    Raises:
        HubError: If the id is not of that form, or ``ORG/NAME`` is not a repository id
            ``huggingface_hub``'s ``validate_repo_id`` accepts.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    repo_id, _, revision = source[len(HUB_PREFIX):].partition("@")
    if not _HUB_ID.match(repo_id) or (revision == "" and "@" in source):
        raise HubError(f"{source!r} is not a Hub id: expected hf-hub:ORG/NAME or "
                       f"hf-hub:ORG/NAME@REVISION, e.g. hf-hub:timm/resnet50.tv2_in1k")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise HubError(f"{source!r} is not a Hub id: {repo_id!r} is not a repository name the "
                       f"Hub allows (ASCII letters, digits, '-', '_', '.'; no '--' or '..', "
                       f"not starting or ending with '-' or '.', at most 96 characters)") from err
    return repo_id, revision or None


def resolve_weights(source: str) -> PretrainedWeights:
    """Resolve a weights source (``hf-hub:`` id, folder, ``.safetensors`` file) to local files,
    downloading a Hub id once per process.

    Raises:
        HubError: For a Hub failure (one line naming the id and what to do).
        MissingFileError: If a folder or file does not exist or lacks ``model.safetensors``.
    """
    if source.startswith(HUB_PREFIX):
        weights, config = _download(source)
    elif os.path.isdir(source):
        weights = os.path.join(source, WEIGHTS_FILE)
        if not os.path.isfile(weights):
            raise MissingFileError(f"folder {source} holds no {WEIGHTS_FILE} (expected "
                                   f"{WEIGHTS_FILE} and {CONFIG_FILE}, as hf download "
                                   f"--local-dir writes them)")
        config = os.path.join(source, CONFIG_FILE)
    else:
        if not os.path.isfile(source):
            raise MissingFileError(f"weights file not found: {source}")
        weights, config = source, os.path.join(os.path.dirname(source), CONFIG_FILE)
    return PretrainedWeights(source, weights, _read_config(config, source),
                             config or CONFIG_FILE)


@functools.lru_cache(maxsize=8)
def _download(source):
    """(weights file, config file or None) of a Hub id, through huggingface_hub's cache;
    once per id in a process (a failure is not remembered)."""
    repo_id, revision = parse_hub_id(source)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    at = f" at revision {revision}" if revision else ""
    files = []
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        try:
            hub_logger.setLevel(logging.ERROR)  # its retry warnings: our error says it all
            files.append(hf_hub_download(repo_id, name, revision=revision))
        except GatedRepoError as err:
            raise HubError(f"{source}: the repository is gated: accept its terms on its Hub "
                           f"page, then log in (hf auth login) or set HF_TOKEN") from err
        except RevisionNotFoundError as err:
            raise HubError(f"{source}: revision {revision!r} does not exist in {repo_id} "
                           f"(give a branch, tag or commit of it)") from err
        except RepositoryNotFoundError as err:
            raise HubError(f"{source}: no such model repository on the Hub (private ones need "
                           f"HF_TOKEN); ImageNet ResNets that load: "
                           f"{', '.join(HUB_PREFIX + i for i in KNOWN_IDS)}") from err
        except LocalEntryNotFoundError as err:
            if name == CONFIG_FILE and files:
                files.append(None)  # cached weights without a config: no eval settings
                continue
            raise HubError(f"{source}: {name}{at} is not in the Hugging Face cache "
                           f"({_cache_dir()}) and cannot be downloaded "
                           f"({'HF_HUB_OFFLINE is set' if _offline() else 'no connection'}): "
                           f"connect and run again, or download it where there is a "
                           f"connection (hf download {repo_id}) and copy the cache") from err
        except (RemoteEntryNotFoundError, EntryNotFoundError) as err:
            if name == CONFIG_FILE:
                files.append(None)
                continue
            raise HubError(f"{source}: the repository{at} has no {WEIGHTS_FILE} (timm's "
                           f"safetensors weights); it cannot be loaded here") from err
        except (HfHubHTTPError, OSError) as err:
            raise HubError(f"{source}: downloading {name}{at} failed: "
                           f"{str(err).splitlines()[0]} (run again to retry; the cache keeps "
                           f"no incomplete file)") from err
        finally:
            hub_logger.setLevel(level)
    return files[0], files[1]


def _cache_dir():
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE


def _offline():
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


def _read_config(path, source):
    if path is None or not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HubError(f"{source}: cannot read {path} as JSON: {err}") from err
    if not isinstance(config, dict):
        raise HubError(f"{source}: {path} is not a JSON object")
    return config


def _read_bytes(weights, size=-1):
    """The first ``size`` bytes of the weights file (-1: all); an OS failure (permission denied,
    I/O error) is named as it is, with no advice to delete a file that may be good."""
    try:
        with open(weights.weights_file, "rb") as f:
            return f.read(size)
    except OSError as err:
        raise HubError(f"{weights.source}: cannot read {weights.weights_file}: "
                       f"{err.strerror or err}") from err


def _unreadable(weights, err):
    """The ``HubError`` of a ``.safetensors`` file safetensors cannot read."""
    return HubError(f"{weights.source}: cannot read {weights.weights_file} as safetensors "
                    f"({str(err).splitlines()[0]}): an incomplete download? delete it from the "
                    f"cache (hf cache delete) or the folder and download it again")


FLOAT_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}
"""safetensors float dtypes read as numpy dtypes (``BF16``: widened by ``_bfloat16_to_float32``)."""
INTEGER_LEAVES = ("num_batches_tracked",)
"""Integer tensors the weights may hold: torch's BatchNorm counters (timm and ``export.py`` save
them; loading drops them). Any other integer tensor is refused by name."""


def _bfloat16_to_float32(data):
    """bfloat16 is the upper half of a float32: its 16 bits shifted left are the exact value."""
    return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)


def _tensor_array(weights, name, spec):
    dtype, shape, data = spec["dtype"], spec["shape"], spec["data"]
    if dtype == "BF16":
        return _bfloat16_to_float32(data).reshape(shape)
    if dtype in FLOAT_DTYPES:
        return np.frombuffer(data, FLOAT_DTYPES[dtype]).astype(np.float32).reshape(shape)
    if dtype[0] in "IU" and name.rsplit(".", 1)[-1] in INTEGER_LEAVES:
        return np.frombuffer(data, f"<{dtype[0].lower()}{int(dtype[1:]) // 8}").reshape(shape)
    raise HubError(f"{weights.source}: tensor {name} of {weights.weights_file} is {dtype}; "
                   f"expected float weights (F32, F16 or BF16; integer tensors only as "
                   f"{', '.join(INTEGER_LEAVES)})")


def read_safetensors(weights: PretrainedWeights) -> dict[str, np.ndarray]:
    """Tensor name (torchvision's / timm's) -> numpy array: float16, bfloat16 and float32
    tensors as float32 (widened exactly), ``INTEGER_LEAVES`` as stored.

    Raises:
        HubError: If the file is not a complete safetensors file, or holds another integer
            tensor or a dtype not in ``FLOAT_DTYPES`` (names it, the tensor and the source).
    """
    from safetensors import deserialize
    data = _read_bytes(weights)
    try:
        tensors = deserialize(data)
    except Exception as err:  # noqa: BLE001  safetensors' SafetensorError, OSError alike
        raise _unreadable(weights, err) from err
    return {name: _tensor_array(weights, name, spec) for name, spec in tensors}


def safetensors_shapes(weights: PretrainedWeights) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a ``.safetensors`` file, read from its header alone.

    Raises:
        HubError: As ``read_safetensors``.
    """
    from safetensors import safe_open
    _read_bytes(weights, 0)
    try:
        with safe_open(weights.weights_file, framework="numpy") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as err:  # noqa: BLE001  safetensors' SafetensorError, OSError alike
        raise _unreadable(weights, err) from err


def check_architecture(weights: PretrainedWeights, net_name: str | None = None) -> str | None:
    """``config.json``'s architecture (``resnet18`` .. ``resnet152``), or None when it names none.

    Raises:
        PretrainedMismatchError: If this package does not build it (lists the ids that fit), or
            it differs from ``net_name`` (None: not checked).
    """
    arch = weights.config.get("architecture")
    if arch is None:
        return None
    if arch not in BUILT_ARCHITECTURES:
        raise PretrainedMismatchError(
            f"{weights.source} holds a {arch}, a network this package does not build (it "
            f"builds torchvision's {', '.join(BUILT_ARCHITECTURES)}); weights that fit: "
            f"{', '.join(HUB_PREFIX + i for i in KNOWN_IDS)}")
    if net_name is not None and arch != net_name:
        raise PretrainedMismatchError(f"{weights.source} holds a {arch} but net_name is "
                                      f"{net_name}: pass --net_name {arch}")
    return arch


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _size_field(weights, name, size):
    """``input_size``-like field -> its side; (3, S, S) with 1 <= S <= the eval_image_size bound."""
    bound = UPPER_BOUNDS["eval_image_size"][0]
    if (not isinstance(size, list) or len(size) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in size)
            or size[0] != 3 or not 1 <= size[1] <= bound):
        raise weights.field_error(f"pretrained_cfg.{name}", size, f"[3, S, S] with S an integer "
                                  f"in 1..{bound} (eval_image_size's range)")
    if size[1] != size[2]:
        raise PretrainedMismatchError(f"{weights.source}: input size {size} is not square "
                                      f"(3, S, S)")
    return size[1]


def _crop_pct_field(weights, name, crop_pct, side):
    """floor(side / crop_pct), timm's resize before the center crop, checked as eval_resize."""
    bound = UPPER_BOUNDS["eval_resize"][0]
    if not _is_number(crop_pct) or not 0 < crop_pct <= 1:
        raise weights.field_error(f"pretrained_cfg.{name}", crop_pct, "a number in (0, 1]")
    resize = int(math.floor(side / crop_pct))
    if resize > bound:
        raise weights.field_error(f"pretrained_cfg.{name}", crop_pct,
                                  f"a fraction giving an eval_resize of at most {bound}, "
                                  f"floor({side} / crop_pct) = {resize}")
    return resize


def pretrained_eval_settings(weights: PretrainedWeights) -> dict[str, int | str]:
    """The eval preprocessing of the weights' ``pretrained_cfg`` as config keys:
    ``eval_image_size``, ``eval_resize`` = floor(size / crop_pct) as timm computes it,
    ``eval_interpolation``; from ``test_input_size`` / ``test_crop_pct`` when given. Only the
    keys it gives, in the ranges the keys have on the command line.

    Raises:
        WeightsConfigError: For a field of a wrong type or out of range (names the file).
        PretrainedMismatchError: For another mean or std than ImageNet's, a size that is not
            square, or an interpolation not in ``INTERPOLATIONS``.
    """
    info = weights.pretrained_cfg
    for key, expected in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
        if key not in info:
            continue
        value = info[key]
        if not isinstance(value, list) or len(value) != 3 or not all(map(_is_number, value)):
            raise weights.field_error(f"pretrained_cfg.{key}", value,
                                      "a list of 3 numbers (per RGB channel)")
        if not np.allclose(value, expected, rtol=0, atol=1e-6):
            raise PretrainedMismatchError(
                f"{weights.source} expects images normalized with {key} {value}, but this "
                f"package normalizes with ImageNet's {key} {list(expected)}: these weights "
                f"would be evaluated on wrongly normalized images")
    settings = {}
    size_key = "test_input_size" if info.get("test_input_size") is not None else "input_size"
    crop_key = "test_crop_pct" if info.get("test_crop_pct") is not None else "crop_pct"
    if info.get(size_key) is not None:
        side = _size_field(weights, size_key, info[size_key])
        settings["eval_image_size"] = side
        if info.get(crop_key) is not None:
            settings["eval_resize"] = _crop_pct_field(weights, crop_key, info[crop_key], side)
    interpolation = info.get("interpolation")
    if interpolation:
        if not isinstance(interpolation, str) or interpolation not in INTERPOLATIONS:
            raise PretrainedMismatchError(
                f"{weights.source}: interpolation {interpolation!r} is not one this package "
                f"applies ({', '.join(INTERPOLATIONS)})")
        settings["eval_interpolation"] = interpolation
    return settings

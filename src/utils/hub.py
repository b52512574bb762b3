"""Pretrained weights in timm's Hugging Face Hub form: ``model.safetensors`` + ``config.json``.

A weights source (``--pre_trained``, ``--checkpoint_path``) is one of:

- ``hf-hub:ORG/NAME[@REVISION]`` (timm's spelling): downloaded once into the Hugging Face
  cache by ``huggingface_hub`` (``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_TOKEN``
  as that library reads them; revision: a branch, tag or commit, default ``main``);
- a folder holding ``model.safetensors`` and ``config.json`` (what ``hf download REPO
  --local-dir FOLDER`` writes, and what ``export.py --file_format SAFETENSORS`` writes);
- a bare ``.safetensors`` file (a ``config.json`` beside it is read when present).

The tensors are read with safetensors' numpy loader: neither library needs PyTorch. Their
names (torchvision's / timm's) are mapped to ours by the ``torchvision`` layout of
``src.utils.checkpoint``. ``config.json`` is timm's (``timm/models/_hub.py``): ``architecture``,
``num_classes``, optionally ``label_names``, and the weights' ``pretrained_cfg`` (input size,
crop_pct, interpolation, mean, std), used by ``pretrained_eval_settings``.
"""
import functools
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from src.utils.architectures import ARCHITECTURES
from src.utils.errors import MissingFileError, UserError

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
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic")
"""Eval resize filters this package applies (PIL's, as torchvision and timm on PIL images)."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubError(UserError):
    """Weights cannot be had from the named source (unknown id or revision, gated, offline
    without a cached copy, an incomplete download, a folder without the files)."""


class PretrainedMismatchError(UserError, ValueError):
    """The weights are of a network this package does not build, or do not fit the config
    (``net_name``, normalization)."""


@dataclass(frozen=True)
class PretrainedWeights:
    """Weights resolved to local files.

    Attributes:
        source (str): As the user gave it (``hf-hub:timm/resnet50.tv2_in1k``, a folder, a
            file), for messages and result files.
        weights_file (str): The local ``.safetensors`` file.
        config (dict): ``config.json`` (timm's format); empty when there is none.
    """

    source: str
    weights_file: str
    config: dict = field(default_factory=dict)

    @property
    def pretrained_cfg(self):
        """The weights' ``pretrained_cfg`` (timm): eval settings and provenance; {} if none."""
        return self.config.get("pretrained_cfg") or {}

    @property
    def label_names(self):
        """``config.json``'s ``label_names`` (class names in label order: timm writes a list,
        or a dict of class index -> name), or None."""
        names = self.config.get("label_names")
        if isinstance(names, dict):
            names = [name for _, name in sorted((int(k), v) for k, v in names.items())]
        return [str(n) for n in names] if isinstance(names, list) and names else None


def is_pretrained_source(path):
    """Whether ``path`` names weights in the Hub form (an ``hf-hub:`` id, a folder or a
    ``.safetensors`` file) rather than a ``.ckpt`` / exported model file."""
    return bool(path) and (path.startswith(HUB_PREFIX) or path.endswith(SUFFIX)
                           or os.path.isdir(path))


def parse_hub_id(source):
    """``hf-hub:ORG/NAME[@REVISION]`` -> (``ORG/NAME``, revision or None).

    Raises:
        HubError: If the id is not of that form.
    """
    repo_id, _, revision = source[len(HUB_PREFIX):].partition("@")
    if not _HUB_ID.match(repo_id) or (revision == "" and "@" in source):
        raise HubError(f"{source!r} is not a Hub id: expected hf-hub:ORG/NAME or "
                       f"hf-hub:ORG/NAME@REVISION, e.g. hf-hub:timm/resnet50.tv2_in1k")
    return repo_id, revision or None


def resolve_weights(source):
    """Resolve a weights source to local files, downloading an ``hf-hub:`` id (once per
    process; later runs find it in the cache).

    Args:
        source (str): ``hf-hub:ORG/NAME[@REVISION]``, a folder with ``model.safetensors``
            and ``config.json``, or a ``.safetensors`` file.

    Returns:
        PretrainedWeights: The local weights file and the parsed ``config.json``.

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
    return PretrainedWeights(source, weights, _read_config(config, source))


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


def _unreadable(weights, err):
    """The ``HubError`` of a ``.safetensors`` file safetensors cannot read."""
    return HubError(f"{weights.source}: cannot read {weights.weights_file} as safetensors "
                    f"({str(err).splitlines()[0]}): an incomplete download? delete it from the "
                    f"cache (hf cache delete) or the folder and download it again")


def read_safetensors(weights):
    """The tensors of a ``.safetensors`` file as numpy arrays (safetensors' numpy loader).

    Args:
        weights (PretrainedWeights): As ``resolve_weights`` returns.

    Returns:
        dict[str, numpy.ndarray]: Tensor name (torchvision's / timm's) -> array, in the
        file's dtype.

    Raises:
        HubError: If the file is not a complete safetensors file (names it and the source).
    """
    from safetensors.numpy import load_file
    try:
        return load_file(weights.weights_file)
    except Exception as err:  # noqa: BLE001  safetensors' SafetensorError, OSError alike
        raise _unreadable(weights, err) from err


def safetensors_shapes(weights):
    """Tensor name -> shape of a ``.safetensors`` file, read from its header alone.

    Raises:
        HubError: As ``read_safetensors``.
    """
    from safetensors import safe_open
    try:
        with safe_open(weights.weights_file, framework="numpy") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as err:  # noqa: BLE001  safetensors' SafetensorError, OSError alike
        raise _unreadable(weights, err) from err


def check_architecture(weights, net_name=None):
    """The network ``weights`` hold, by ``config.json``'s ``architecture`` when it has one.

    Args:
        weights (PretrainedWeights): As ``resolve_weights`` returns.
        net_name (str, optional): The configured network; None: not checked.

    Returns:
        str or None: ``resnet18`` .. ``resnet152``, None when ``config.json`` names none (the
        tensors decide then).

    Raises:
        PretrainedMismatchError: If the architecture is one this package does not build
            (``resnet50d``, ``resnext50_32x4d``, ``resnetv2_50``, ...; lists the ids that
            fit), or differs from ``net_name``.
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


def pretrained_eval_settings(weights):
    """The eval preprocessing the weights were evaluated with, as our config keys (timm's
    ``pretrained_cfg`` -> ``eval_image_size``, ``eval_resize`` = floor(size / crop_pct) as
    timm's eval transform computes it, ``eval_interpolation``), from ``test_input_size`` /
    ``test_crop_pct`` when given, else ``input_size`` / ``crop_pct``.

    Args:
        weights (PretrainedWeights): As ``resolve_weights`` returns.

    Returns:
        dict: Config key -> value, only those the ``pretrained_cfg`` gives.

    Raises:
        PretrainedMismatchError: If the weights ask for another mean or std than ImageNet's
            (the pipeline normalizes with ImageNet's) or an interpolation not in
            ``INTERPOLATIONS``.
    """
    info = weights.pretrained_cfg
    for key, expected in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
        if key in info and not np.allclose(info[key], expected, rtol=0, atol=1e-6):
            raise PretrainedMismatchError(
                f"{weights.source} expects images normalized with {key} {info[key]}, but this "
                f"package normalizes with ImageNet's {key} {list(expected)}: these weights "
                f"would be evaluated on wrongly normalized images")
    settings = {}
    size = info.get("test_input_size") or info.get("input_size")
    crop_pct = info.get("test_crop_pct") or info.get("crop_pct")
    if size:
        if len(size) != 3 or size[1] != size[2]:
            raise PretrainedMismatchError(f"{weights.source}: input size {size} is not square "
                                          f"(3, S, S)")
        settings["eval_image_size"] = int(size[-1])
        if crop_pct:
            settings["eval_resize"] = int(math.floor(size[-1] / crop_pct))
    interpolation = info.get("interpolation")
    if interpolation:
        if interpolation not in INTERPOLATIONS:
            raise PretrainedMismatchError(
                f"{weights.source}: interpolation {interpolation!r} is not one this package "
                f"applies ({', '.join(INTERPOLATIONS)})")
        settings["eval_interpolation"] = interpolation
    return settings

"""Publishing weights as timm and torchvision users load them (``export.py --file_format
SAFETENSORS``): a folder of ``model.safetensors`` (torchvision's / timm's tensor names),
``config.json`` and a ``README.md`` model card, in timm's format (``timm/models/_hub.py``:
``save_for_hf``, ``save_config``). See docs/deployment.md#publish-on-the-hugging-face-hub.
"""
import hashlib
import json
import logging
import math
import os
import re
import shutil
import stat
import tempfile
import time

import numpy as np
import safetensors.numpy
from mindspore import nn

from src.data.settings import EvalPreprocess
from src.utils.architectures import ARCHITECTURES
from src.utils.checkpoint import source_names
from src.utils.errors import OutputDirError, WriteError
from src.utils.files import current_umask, plain_file_mode
from src.utils.hub import CONFIG_FILE, WEIGHTS_FILE
from src.utils.tasks import DEFAULT_TASK, MULTILABEL, PROBLEM_TYPES, get_task

LOGGER = logging.getLogger(__name__)

CARD_FILE = "README.md"
MARKER = re.compile(r"<!-- written by export\.py: card sha256 (?P<card>[0-9a-f]{64}), "
                    r"config\.json sha256 (?P<config>[0-9a-f]{64}) -->")
"""``card_marker``'s line."""


def torchvision_state(net: nn.Cell) -> dict[str, np.ndarray]:
    """A network's weights as float32 arrays under torchvision's ``state_dict`` names, plus
    ``num_batches_tracked`` int64 0 per BatchNorm, as ``load_state_dict(strict=True)`` wants."""
    params = {p.name: p for p in net.get_parameters()}
    names = source_names(params, "torchvision")
    state = {names[n]: np.ascontiguousarray(p.asnumpy(), dtype=np.float32)
             for n, p in params.items()}
    for name in [n for n in state if n.endswith(".running_mean")]:
        state[name[:-len("running_mean")] + "num_batches_tracked"] = np.array(0, np.int64)
    return dict(sorted(state.items()))


def crop_pct_for(image_size: int, eval_resize: int) -> float:
    """timm's ``crop_pct`` for a resize-then-crop: the largest float whose
    ``floor(image_size / crop_pct)`` (timm's eval transform) is ``eval_resize``."""
    crop_pct = image_size / eval_resize
    while math.floor(image_size / crop_pct) < eval_resize:
        crop_pct = float(np.nextafter(crop_pct, 0.0))
    return crop_pct


def timm_config(net_name: str, class_num: int, preprocess: EvalPreprocess,
                label_names: list[str] | None = None, *, tta: str = "none",
                thresholds=None) -> dict:
    """``config.json`` in timm's format for our weights.

    Args:
        net_name (str): ``resnet18`` .. ``resnet152`` (timm's architecture names).
        class_num (int): Classifier outputs.
        preprocess (EvalPreprocess): The eval preprocessing the weights are evaluated with.
        label_names (list[str], optional): Class names in label order.
        tta (str): The test-time augmentation to evaluate them with; other than ``none``,
            a top-level ``tta`` field (timm ignores it; eval.py and predict.py take it).
        thresholds (sequence of float, optional): A multi-label model's per-class decision
            thresholds: ``problem_type`` ``multi_label_classification`` (Hugging Face's name)
            and a top-level ``thresholds`` field; None: a single-label classifier.

    Returns:
        dict: JSON-serializable config.
    """
    image_size = preprocess.image_size
    pool = math.ceil(image_size / 32)
    config = {"architecture": net_name, "num_classes": class_num,
              "num_features": ARCHITECTURES[net_name].num_features, "global_pool": "avg"}
    if label_names:
        config["label_names"] = list(label_names)
    config["pretrained_cfg"] = {
        "tag": "", "custom_load": False, "input_size": [3, image_size, image_size],
        "fixed_input_size": False, "interpolation": preprocess.interpolation,
        "crop_pct": crop_pct_for(image_size, preprocess.resize), "crop_mode": "center",
        "mean": list(preprocess.mean), "std": list(preprocess.std), "num_classes": class_num,
        "pool_size": [pool, pool], "first_conv": "conv1", "classifier": "fc"}
    if tta != "none":
        config["tta"] = tta
    if thresholds is not None:
        config["problem_type"] = MULTILABEL.problem_type
        config["thresholds"] = [float(v) for v in thresholds]
    return config


def model_card(repo_name: str, config: dict, source: str, *, run_config: dict | None = None,
               eval_result: dict | None = None, license_id: str = "other") -> str:
    """A ``README.md`` model card (Hugging Face's front matter, then Markdown) for the folder
    ``repo_name`` with ``config`` (``timm_config``) of the weights of ``source``: the training
    run's config stored in our checkpoints (``run_config``), an ``eval_result.json`` of them,
    the ``license`` field (an SPDX id or ``other``) and how to load them."""
    arch, preprocessing = config["architecture"], config["pretrained_cfg"]
    origin = ("trained with MindSpore (this package) and exported" if run_config
              else "exported with this MindSpore package")
    lines = ["---", "tags:", "- image-classification", "- timm", "- mindspore",
             "library_name: timm", f"license: {license_id}", "---", "",
             f"# {repo_name}", "",
             f"A {arch} image classifier ({config['num_classes']} classes) of torchvision's "
             f"ResNet structure, {origin} from `{source}`.", "", "## Training", ""]
    if run_config:
        keys = ("data_path", "dataset", "class_num", "epoch_size", "batch_size", "device_num",
                "optimizer", "base_lr", "lr_schedule", "weight_decay", "label_smoothing",
                "train_image_size", "auto_augment", "mixup_alpha", "cutmix_alpha",
                "ema_decay", "pre_trained", "config_path")
        lines += [f"- `{k}`: {run_config[k]}" for k in keys if run_config.get(k) not in
                  (None, "")]
    else:
        lines.append("Not recorded in the checkpoint.")
    lines += ["", "## Evaluation", ""]
    if eval_result:
        task = get_task(eval_result.get("task", DEFAULT_TASK))
        scores = (f"mAP {eval_result['mAP']:.4f}, macro F1 {eval_result['macro_f1']:.4f} at "
                  f"its thresholds" if task.uses_thresholds else
                  f"top-1 {eval_result['top1']:.4f}, top-5 {eval_result['top5']:.4f}")
        lines.append(f"{scores} on {eval_result['images']} images of "
                     f"`{eval_result.get('data_path', '?')}` (eval.py, "
                     f"{eval_result.get('runtime', 'mindspore')}, test-time augmentation "
                     f"{eval_result.get('tta', 'none')}).")
    else:
        lines.append("No eval_result.json was found beside the checkpoint.")
    if config.get("tta"):
        lines += ["", f"Test-time augmentation: {config['tta']} (`tta` in config.json: the "
                      f"logits of the image and of its horizontal mirror averaged). This "
                      f"package's eval.py and predict.py apply it; timm and torchvision do not."]
    if PROBLEM_TYPES.get(config.get("problem_type"), DEFAULT_TASK).uses_thresholds:
        lines += ["", f"Multi-label: one sigmoid per class (not a softmax); an image has every "
                      f"label whose probability reaches its threshold (`thresholds` in "
                      f"config.json, one per class in `label_names` order: "
                      f"{', '.join(f'{v:g}' for v in config['thresholds'])}). This package's "
                      f"eval.py and predict.py apply them."]
    size = preprocessing["input_size"][-1]
    resize = math.floor(size / preprocessing["crop_pct"])
    lines += ["", f"Preprocessing: resize the shorter side to "
                  f"{resize} px ({preprocessing['interpolation']}), center "
                  f"crop {size} px, ImageNet mean/std normalization of 0-1 RGB pixels.", "",
              "## Use", "", "MindSpore (this package):", "", "```bash",
              f"python predict.py --checkpoint_path {repo_name} --image_path photo.jpg",
              f"python train.py --pre_trained {repo_name} --data_path FOLDER --class_num N",
              "```", "", "timm:", "", "```python", "import timm",
              f"model = timm.create_model('local-dir:{repo_name}', pretrained=True)",
              "# from the Hub after `hf upload ORG/NAME " + repo_name + "`:",
              "# timm.create_model('hf-hub:ORG/NAME', pretrained=True)", "```", "",
              "torchvision:", "", "```python", "import torchvision",
              "from safetensors.torch import load_file",
              f"model = torchvision.models.{arch}(num_classes={config['num_classes']})",
              f"model.load_state_dict(load_file('{repo_name}/{WEIGHTS_FILE}'))", "```", ""]
    return "\n".join(lines)


def card_marker(card: str, config_text: str) -> str:
    """The last line of a card the export writes: the SHA-256 of the card above it and of
    its ``config.json`` text, by which the next export tells them from hand-edited ones."""
    return (f"<!-- written by export.py: card sha256 {_sha256(card)}, config.json sha256 "
            f"{_sha256(config_text)} -->\n")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def edited_files(folder: str) -> list[str]:
    """The ``README.md`` and ``config.json`` of an earlier export folder that its export did
    not write as they are (no ``card_marker``, or another hash): hand-written or edited."""
    texts = {}
    for name in (CARD_FILE, CONFIG_FILE):
        try:
            with open(os.path.join(folder, name), encoding="utf-8", newline="") as f:
                texts[name] = f.read()
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError):
            texts[name] = None  # unreadable: not ours as far as can be told
    card = texts.get(CARD_FILE) or ""
    match = ([None, *MARKER.finditer(card)])[-1]  # the last one: lines added below it
    ours = {}
    if match:
        ours = {CARD_FILE: card[match.end():] == "\n"
                and _sha256(card[:match.start()]) == match["card"],
                CONFIG_FILE: texts.get(CONFIG_FILE) is not None
                and _sha256(texts[CONFIG_FILE]) == match["config"]}
    return [name for name in texts if not ours.get(name)]


def check_folder_target(folder: str) -> None:
    """OutputDirError if ``folder`` (``file_name``) is an existing file, not a folder."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise OutputDirError(f"file_name {folder} is a file: file_format SAFETENSORS writes a "
                             f"folder ({WEIGHTS_FILE}, {CONFIG_FILE}, {CARD_FILE}); choose "
                             f"another --file_name")


def save_hub_folder(folder: str, state: dict[str, np.ndarray], config: dict,
                    card: str) -> list[str]:
    """Write ``model.safetensors`` (``state``), ``config.json`` and ``README.md`` (``card``
    plus ``card_marker``) as the folder ``folder``, all three or none: into a staging folder
    beside it, then switched with it. Other files of an earlier folder move into the new one;
    if its card or config.json were edited (``edited_files``) it is kept beside, with a log
    line. Modes follow the umask. See docs/deployment.md#writing-the-folder.

    Returns:
        list[str]: The three files.

    Raises:
        OutputDirError: If ``folder`` is a file (``check_folder_target``).
        WriteError: Naming what could not be written and the OS reason; the earlier folder
            (or none) is left as it was and no staging file is left.
    """
    folder = os.path.realpath(folder)
    check_folder_target(folder)
    parent, name = os.path.split(folder)
    card += "" if card.endswith("\n") else "\n"
    config_text = json.dumps(config, indent=2) + "\n"
    files = {WEIGHTS_FILE: safetensors.numpy.save(state, metadata={"format": "pt"}),
             CONFIG_FILE: config_text.encode("utf-8"),
             CARD_FILE: (card + card_marker(card, config_text)).encode("utf-8")}
    earlier = os.path.isdir(folder)
    staging, target = None, folder
    try:
        if earlier:
            _check_writable(folder)
        staging = tempfile.mkdtemp(dir=parent, prefix=f".{name}.staging.")
        for file_name, data in files.items():
            target = os.path.join(folder, file_name)
            _write_file(os.path.join(staging, file_name), data)
        target = folder
        os.chmod(staging, stat.S_IMODE(os.stat(folder).st_mode) if earlier
                 else 0o777 & ~current_umask())
        if earlier:
            _switch(folder, staging)
        else:
            os.rename(staging, folder)
        staging = None
    except OSError as err:
        raise WriteError(f"cannot write {target}: {err.strerror or err}") from err
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return [os.path.join(folder, f) for f in files]


def _check_writable(folder):
    """OSError (the OS reason) if no file can be made in ``folder``."""
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".write_check_")
    os.close(fd)
    os.remove(probe)


def _write_file(path, data):
    """``data`` to the new file ``path``, flushed to disk, a plain write's mode."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        plain_file_mode(f.fileno())
        os.fsync(f.fileno())


def _switch(folder, staging):
    """Put ``staging`` in place of the existing ``folder`` (renamed aside, then back if the
    second rename fails); move the earlier folder's other files into it, then keep the
    earlier folder beside it if it held edited files, else delete it."""
    edited = edited_files(folder)
    aside = tempfile.mkdtemp(dir=os.path.dirname(folder),
                             prefix=f".{os.path.basename(folder)}.earlier.")
    try:
        os.rename(folder, aside)  # replaces the empty folder ``aside``
    except OSError:
        os.rmdir(aside)
        raise
    try:
        os.rename(staging, folder)
    except OSError:
        os.rename(aside, folder)
        raise
    for entry in sorted(os.listdir(aside)):
        if entry not in (WEIGHTS_FILE, CONFIG_FILE, CARD_FILE):
            try:
                os.rename(os.path.join(aside, entry), os.path.join(folder, entry))
            except OSError as err:
                edited.append(f"{entry} ({err.strerror})")
    if not edited:
        shutil.rmtree(aside, ignore_errors=True)
        if os.path.exists(aside):
            LOGGER.warning("could not delete the earlier folder %s (moved aside): delete it "
                           "by hand", aside)
        return
    kept = f"{folder}.before_export_{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 0
    while os.path.exists(kept + (f"-{suffix}" if suffix else "")):
        suffix += 1
    kept += f"-{suffix}" if suffix else ""
    try:
        os.rename(aside, kept)
    except OSError:
        kept = aside  # the new folder is in place: keep the earlier one where it is
    LOGGER.warning("%s held %s not written by export.py (edited by hand?): the earlier folder "
                   "is kept whole as %s", folder, " and ".join(edited), kept)

"""Publishing weights as timm and torchvision users load them (``export.py --file_format
SAFETENSORS``): a folder of ``model.safetensors`` (torchvision's / timm's tensor names),
``config.json`` and a ``README.md`` model card, in timm's format (``timm/models/_hub.py``:
``save_for_hf``, ``save_config``). See docs/deployment.md#publish-on-the-hugging-face-hub.
"""
import json
import math
import os

import numpy as np
from mindspore import nn

from src.utils.architectures import ARCHITECTURES
from src.utils.checkpoint import source_names
from src.utils.errors import WriteError
from src.utils.files import atomic_write_text
from src.utils.hub import CONFIG_FILE, WEIGHTS_FILE

CARD_FILE = "README.md"


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


def timm_config(net_name, class_num, preprocess, label_names=None):
    """``config.json`` in timm's format for our weights.

    Args:
        net_name (str): ``resnet18`` .. ``resnet152`` (timm's architecture names).
        class_num (int): Classifier outputs.
        preprocess (EvalPreprocess): The eval preprocessing the weights are evaluated with.
        label_names (list[str], optional): Class names in label order.

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
        lines.append(f"top-1 {eval_result['top1']:.4f}, top-5 {eval_result['top5']:.4f} on "
                     f"{eval_result['images']} images of `{eval_result.get('data_path', '?')}`"
                     f" (eval.py, {eval_result.get('runtime', 'mindspore')}).")
    else:
        lines.append("No eval_result.json was found beside the checkpoint.")
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


def save_hub_folder(folder: str, state: dict[str, np.ndarray], config: dict,
                    card: str) -> list[str]:
    """Write ``model.safetensors`` (``state``), ``config.json`` and ``README.md`` into
    ``folder`` (created if missing), each whole or not at all; returns the files.

    Raises:
        WriteError: Naming the file that could not be written (an earlier one is kept).
    """
    from safetensors.numpy import save_file
    os.makedirs(folder, exist_ok=True)
    weights = os.path.join(folder, WEIGHTS_FILE)
    partial = weights + ".partial"
    try:
        save_file(state, partial, metadata={"format": "pt"})  # timm's and transformers' tag
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, weights)
    except Exception as err:  # noqa: BLE001  OSError, safetensors' SafetensorError alike
        if os.path.exists(partial):
            os.remove(partial)
        raise WriteError(f"cannot write {weights}: {err.strerror or err}") from err
    files = [weights, os.path.join(folder, CONFIG_FILE), os.path.join(folder, CARD_FILE)]
    atomic_write_text(files[1], json.dumps(config, indent=2) + "\n")
    atomic_write_text(files[2], card)
    return files

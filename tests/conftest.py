"""Shared fixtures. MindSpore gets the same oneDNN setting as the entry points."""
import os

import pytest

from src.env import set_cpu_fast_path
from tests.helpers import SHARED_DATA, copy_class_folders

set_cpu_fast_path()  # before any test module imports MindSpore


@pytest.fixture(scope="session")
def shared_data():
    """``../shared/data`` beside the repository (real CIFAR-10 and ImageNet images)."""
    if not os.path.isdir(SHARED_DATA):
        pytest.fail(f"real test data not found at {SHARED_DATA} (../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def cifar_small(shared_data, tmp_path_factory):
    """Real CIFAR-10 JPEGs: 8 train and 3 test images per class, in class folders."""
    root = tmp_path_factory.mktemp("cifar_small")
    src = os.path.join(shared_data, "cifar10")
    return {"train": copy_class_folders(os.path.join(src, "train"), str(root / "train"), 8),
            "test": copy_class_folders(os.path.join(src, "test"), str(root / "test"), 3)}

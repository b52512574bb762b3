"""Input pipelines on ``mindspore.dataset``; entry points ``create_dataset`` (a batched
pipeline) and ``create_transforms`` (per-image ops). The names the entry points use are
exported here: class names, image checks, folders and label files, folds."""
from src.data.class_names import CIFAR10_CLASSES, CLASS_NAMES_FILE, write_class_names
from src.data.folds import (
    FOLDS_HEADER,
    TABLE_FOLDS_HEADER,
    folds_text,
    link_fold_images,
    out_of_fold,
    record_folds,
    write_fold_label_file,
)
from src.data.image_check import ImageFolderError, readable_pipeline_errors, set_max_image_pixels
from src.data.multilabel import read_label_file
from src.data.pipeline import class_names_of, count_images, create_dataset, image_folder_files
from src.data.settings import Sampling
from src.data.split import relative_path
from src.data.transforms import create_transforms

__all__ = [
    "create_dataset", "create_transforms",  # the pipelines
    "CIFAR10_CLASSES", "CLASS_NAMES_FILE", "write_class_names",  # class_names
    "FOLDS_HEADER", "TABLE_FOLDS_HEADER", "folds_text", "link_fold_images", "out_of_fold",
    "record_folds", "write_fold_label_file",  # folds
    "ImageFolderError", "readable_pipeline_errors", "set_max_image_pixels",  # image_check
    "read_label_file",  # multilabel
    "class_names_of", "count_images", "image_folder_files",  # pipeline
    "Sampling",  # settings
    "relative_path",  # split
]

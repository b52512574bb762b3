"""Find likely label errors in a class-folder data set: out-of-sample probabilities from K-fold
cross-validation, then confident learning.

    python label_issues.py --config_path configs/quick_start.yaml --data_path DIR \
        --output_dir output/label_issues --label_folds 4 --epoch_size 8
    python label_issues.py ... --run_distribute true --device_num 2   # each fold data parallel

Reads top to bottom: config -> data and folds -> output folder (lock, folds.csv, the fold
recipe) -> each fold: train.py on the other folds (its own folder, resumed with --resume_ckpt
auto; a finished fold is skipped) and its held-out images predicted -> confident learning
(cleanlab's find_label_issues, ranked by self-confidence) -> label_issues.csv and
label_issues.html. The training keys given (a --config_path recipe, --epoch_size,
--pre_trained, ...) are every fold's; --run_distribute true runs each fold with the
data-parallel launcher of scripts/ for device_target. Rerun the same command to resume an
interrupted one. Outputs, resuming and exit statuses (0 done, 2 bad input, a fold's own
status, 128 + signal): docs/label_issues.md.
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import io
import json
import os

import numpy as np

from src.data import (
    class_names_of,
    fold_assignment,
    folds_text,
    image_folder_files,
    link_fold_images,
    out_of_fold,
    record_folds,
    relative_path,
    set_max_image_pixels,
)
from src.deploy import find_issues, formats, issue_rows, issues_csv, issues_page, predict_in_batches
from src.recipe import (
    LABEL_ISSUES_SECTIONS,
    RECIPE_FILE,
    changed_training_keys,
    check_label_issues_config,
    drop_evaluation_keys,
    fold_model,
    fold_recipe,
)
from src.training import finished_checkpoint, fold_command, newest_checkpoint, run_fold
from src.utils import (
    ConfigError,
    FileLock,
    Progress,
    UserError,
    atomic_write_bytes,
    atomic_write_text,
    check_output_dir,
    device,
    get_logger,
    parse_config,
    run_entry_point,
)

SECTIONS = LABEL_ISSUES_SECTIONS
"""The config.yaml sections this entry point reads (its --help lists them)."""
HELD_OUT_FILE = "held_out.npz"  # in each fold's folder: its positions and probabilities
LOCK_FILE = ".label_issues.lock"


def main(argv: list[str] | None = None) -> int:
    """Find label issues as configured by ``argv``; print the summary; return 0."""
    # ---- config, data, folds ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(cfg.max_image_pixels)
    log = get_logger("label_issues")
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the class-folder root")
    dropped = drop_evaluation_keys(cfg)
    files = image_folder_files(cfg.data_path)
    class_names = class_names_of(cfg.data_path)
    check_label_issues_config(cfg, class_names)
    labels = np.array([label for _, label in files], np.int64)
    assigned = fold_assignment(labels, cfg.label_folds, cfg.seed, class_names,
                               data_path=cfg.data_path)
    recipe = fold_recipe(cfg)
    if dropped:
        log.info("the folds are evaluated on their held-out images, not during training: %s "
                 "not used", ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}"
                                         for k, v in dropped.items()))

    # ---- output folder: one command at a time, its folds and training keys recorded ----
    check_output_dir(cfg.output_dir)
    lock = FileLock(os.path.join(cfg.output_dir, LOCK_FILE), what=f"output_dir {cfg.output_dir}",
                    in_use=lambda holder: f"output_dir {cfg.output_dir} is in use by another "
                                          f"label_issues.py ({holder}): wait for it to end, or "
                                          f"give another output_dir")
    lock.acquire()
    recipe_path = os.path.join(cfg.output_dir, RECIPE_FILE)
    changed = changed_training_keys(recipe_path, recipe, cfg.defaults)
    if changed:
        raise ConfigError(f"{recipe_path} holds the training keys this output_dir's folds were "
                          f"started with; now {'; '.join(changed)}: the folds would differ. "
                          f"Give those keys as before, or another output_dir")
    record_folds(cfg.output_dir, folds_text(files, assigned, class_names, cfg.data_path),
                 folds=cfg.label_folds, seed=cfg.seed, data_path=cfg.data_path)
    atomic_write_text(recipe_path, recipe.to_yaml())
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    # ---- each fold: trained on the others (resumed, or skipped when done), then predicted ----
    held_out = [fold_probabilities(cfg, fold, files=files, assigned=assigned,
                                   class_names=class_names, log=log)
                for fold in range(cfg.label_folds)]
    probs = out_of_fold(held_out, len(files))

    # ---- confident learning; the outputs ----
    ranked = find_issues(labels, probs)
    rows = issue_rows(ranked, paths=[path for path, _ in files], labels=labels, probs=probs,
                      class_names=class_names)
    summary = {"data_path": cfg.data_path, "images": len(files), "classes": len(class_names),
               "folds": cfg.label_folds, "epoch_size": cfg.epoch_size, "issues": len(rows),
               "out_of_fold_accuracy": round(float((probs.argmax(1) == labels).mean()), 6)}
    write_outputs(cfg.output_dir, rows=rows, probs=probs, labels=labels, files=files,
                  class_names=class_names, summary=summary, shown=cfg.label_page_images,
                  data_path=cfg.data_path, exif_transpose=cfg.exif_transpose)
    print(json.dumps(summary, indent=1))
    lock.release()
    return 0


def fold_probabilities(cfg, fold, *, files, assigned, class_names, log):
    """Fold ``fold`` (0-based): its held-out positions and their probabilities, read from its
    ``HELD_OUT_FILE`` when it is done; otherwise trained (``run_fold``) unless its last
    checkpoint exists, then its held-out images predicted and the file written."""
    count, k = cfg.label_folds, fold + 1
    folder = os.path.join(cfg.output_dir, f"fold_{k}")
    held = np.flatnonzero(assigned == fold)
    done = os.path.join(folder, HELD_OUT_FILE)
    if os.path.isfile(done):
        with np.load(done) as saved:
            if np.array_equal(saved["positions"], held):
                log.info("fold %d/%d: done (%s)", k, count, done)
                return saved["positions"], saved["probabilities"]
    train_dir = os.path.join(folder, "train")
    checkpoint = finished_checkpoint(train_dir, cfg.net_name, cfg.epoch_size)
    if checkpoint is None:
        images = os.path.join(folder, "images")
        link_fold_images(files, np.flatnonzero(assigned != fold), class_names, images)
        command = fold_command(os.path.join(cfg.output_dir, RECIPE_FILE), images, train_dir,
                               fresh=newest_checkpoint(train_dir, cfg.net_name) is None,
                               launcher=cfg.device_target if cfg.run_distribute else None,
                               device_num=cfg.device_num)
        log.info("fold %d/%d: training on %d images in %s", k, count, len(files) - len(held),
                 train_dir)
        run_fold(command, f"fold {k} of {count}", os.path.join(train_dir, "train.log"))
        checkpoint = finished_checkpoint(train_dir, cfg.net_name, cfg.epoch_size)
        if checkpoint is None:
            raise UserError(f"fold {k} of {count}: training ended without its last checkpoint "
                            f"({cfg.net_name}-{cfg.epoch_size}_N.ckpt) in {train_dir}")
    log.info("fold %d/%d: predicting its %d held-out images with %s", k, count, len(held),
             checkpoint)
    probs = predict_images(cfg, checkpoint, [files[i][0] for i in held], class_names)
    buffer = io.BytesIO()
    np.savez(buffer, positions=held, probabilities=probs)
    atomic_write_bytes(done, buffer.getvalue())
    return held, probs


def predict_images(cfg, checkpoint, paths, class_names):
    """float32 (len(paths), C) probabilities of ``paths`` by ``checkpoint``, run as predict.py
    runs it (``fold_model``, ``load_predictor``, ``predict_in_batches``).

    Raises:
        ConfigError: If the checkpoint records other class names than ``class_names``.
    """
    model, model_cfg, preprocess = fold_model(cfg, checkpoint)
    if model.class_names is not None and list(model.class_names) != class_names:
        raise ConfigError(f"{checkpoint} records other class names than data_path "
                          f"{cfg.data_path} has ({list(model.class_names)[:4]} ...)")
    predict = formats.load_predictor(checkpoint, model_cfg.net_name, model_cfg.class_num,
                                     model_cfg.batch_size, use_ema=model_cfg.use_ema,
                                     device_target=model_cfg.device_target,
                                     stem_pool_pad_mode=model_cfg.stem_pool_pad_mode,
                                     runtime=model_cfg.runtime, tta=model_cfg.tta)
    found = []
    with Progress(len(paths), "predict") as progress:
        for batch, _, probs in predict_in_batches(predict, paths, model_cfg.batch_size,
                                                  preprocess, model=model):
            found.append(probs)
            progress.update(len(batch))
    return np.concatenate(found).astype(np.float32)


def write_outputs(output_dir, *, rows, probs, labels, files, class_names, summary, shown,
                  data_path, exif_transpose):
    """``out_of_fold.npz`` (paths relative to ``data_path``, labels, probabilities, class
    names), ``label_issues.csv`` and ``label_issues.html``, each atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, paths=np.array([relative_path(p, data_path) for p, _ in files]),
             labels=labels, probabilities=probs, class_names=np.array(class_names))
    atomic_write_bytes(os.path.join(output_dir, "out_of_fold.npz"), buffer.getvalue())
    csv_path = os.path.join(output_dir, "label_issues.csv")
    atomic_write_text(csv_path, issues_csv(rows))
    page = os.path.join(output_dir, "label_issues.html")
    atomic_write_text(page, issues_page(rows, summary=summary, labels=labels,
                                        class_names=class_names, shown=shown,
                                        exif_transpose=exif_transpose))
    summary.update(csv=csv_path, page=page)


if __name__ == "__main__":
    run_entry_point(main)

"""Find likely label errors in a class-folder data set, or in a multi-label table (a label_file
with task multilabel): out-of-sample probabilities from K-fold cross-validation, then
confident learning.

    python label_issues.py --config_path configs/quick_start.yaml --data_path DIR \
        --output_dir output/label_issues --label_folds 4 --epoch_size 8
    python label_issues.py --config_path configs/multilabel_quick_start.yaml \
        --data_path data/cifar10_mosaics --label_file data/cifar10_mosaics/train.csv \
        --output_dir output/mosaic_issues --label_folds 3 --epoch_size 8
    python label_issues.py ... --run_distribute true --device_num 2   # each fold data parallel

Reads top to bottom: config -> images, given labels and folds (stratified by class; a table:
iterative stratification) -> output folder (lock, folds.csv, the fold recipe) -> each fold:
train.py on the other folds (its own folder, resumed with --resume_ckpt auto; a finished fold
is skipped) and its held-out images predicted -> confident learning (cleanlab's
find_label_issues, its multi-label form for a table, ranked by self-confidence) ->
label_issues.csv and label_issues.html. The training keys given (a --config_path recipe,
--epoch_size, --pre_trained, ...) are every fold's; --run_distribute true runs each fold with
the data-parallel launcher of scripts/ for device_target. Rerun the same command to resume an
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
    FOLDS_HEADER,
    TABLE_FOLDS_HEADER,
    folds_text,
    link_fold_images,
    out_of_fold,
    record_folds,
    relative_path,
    set_max_image_pixels,
    write_fold_label_file,
)
from src.deploy import (
    find_issues,
    formats,
    issue_rows,
    issues_csv,
    issues_page,
    out_of_fold_score,
    predict_in_batches,
)
from src.recipe import (
    LABEL_ISSUES_SECTIONS,
    RECIPE_FILE,
    assign_folds,
    changed_training_keys,
    drop_evaluation_keys,
    fold_model,
    fold_recipe,
    given_labels,
)
from src.training import (
    finished_checkpoint,
    fold_command,
    newest_checkpoint,
    run_fold,
    started_folds,
)
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
        raise ConfigError("data_path is empty: give --data_path, the class-folder root (or the "
                          "folder a label_file's rows are relative to)")
    cfg, dropped = drop_evaluation_keys(cfg)  # a new config: no evaluation in a fold
    given = given_labels(cfg)
    assigned = assign_folds(cfg, given)
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
    started = started_folds(cfg.output_dir, HELD_OUT_FILE) if changed else []
    if started:
        raise ConfigError(f"{recipe_path} holds the training keys this output_dir's folds were "
                          f"started with ({started[0]} has a checkpoint or its predictions); "
                          f"now {'; '.join(changed)}: the folds would differ. Give those keys "
                          f"as before, or another output_dir")
    header = TABLE_FOLDS_HEADER if given.task.multi_hot else FOLDS_HEADER
    record_folds(cfg.output_dir, folds_text(given.paths, given.label_texts, assigned,
                                            cfg.data_path, header=header),
                 folds=cfg.label_folds, seed=cfg.seed, data_path=cfg.data_path)
    if changed:  # nothing trained yet (a fold refused its keys): they are taken as given now
        log.info("%s: no fold has trained yet, the training keys are taken as given now: %s",
                 recipe_path, "; ".join(changed))
    atomic_write_text(recipe_path, recipe.to_yaml())
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    # ---- each fold: trained on the others (resumed, or skipped when done), then predicted ----
    held_out = [fold_probabilities(cfg, fold, given=given, assigned=assigned, log=log)
                for fold in range(cfg.label_folds)]
    probs = out_of_fold(held_out, len(given.paths))

    # ---- confident learning; the outputs ----
    ranked = find_issues(given.labels, probs, given.task)
    rows = issue_rows(ranked, paths=given.paths, labels=given.labels, probs=probs,
                      class_names=given.class_names, task=given.task)
    summary = {"data_path": cfg.data_path, **({"label_file": cfg.label_file}
                                              if given.task.label_file else {}),
               "images": len(given.paths), "classes": len(given.class_names),
               "folds": cfg.label_folds, "epoch_size": cfg.epoch_size, "issues": len(rows),
               **out_of_fold_score(given.labels, probs, given.task)}
    write_outputs(cfg.output_dir, rows=rows, probs=probs, given=given, summary=summary,
                  shown=cfg.label_page_images, data_path=cfg.data_path,
                  exif_transpose=cfg.exif_transpose)
    print(json.dumps(summary, indent=1))
    lock.release()
    return 0


def fold_probabilities(cfg, fold, *, given, assigned, log):
    """Fold ``fold`` (0-based): its held-out positions and their probabilities, read from its
    ``HELD_OUT_FILE`` when it is done; otherwise trained (``run_fold``, on ``fold_data``)
    unless its last checkpoint exists, then its held-out images predicted and the file
    written."""
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
        data_path, label_file = fold_data(cfg, folder, given, np.flatnonzero(assigned != fold))
        command = fold_command(os.path.join(cfg.output_dir, RECIPE_FILE), data_path, train_dir,
                               fresh=newest_checkpoint(train_dir, cfg.net_name) is None,
                               launcher=cfg.device_target if cfg.run_distribute else None,
                               device_num=cfg.device_num, label_file=label_file)
        log.info("fold %d/%d: training on %d images in %s", k, count,
                 len(given.paths) - len(held), train_dir)
        run_fold(command, f"fold {k} of {count}", os.path.join(train_dir, "train.log"))
        checkpoint = finished_checkpoint(train_dir, cfg.net_name, cfg.epoch_size)
        if checkpoint is None:
            raise UserError(f"fold {k} of {count}: training ended without its last checkpoint "
                            f"({cfg.net_name}-{cfg.epoch_size}_N.ckpt) in {train_dir}")
    log.info("fold %d/%d: predicting its %d held-out images with %s", k, count, len(held),
             checkpoint)
    probs = predict_images(cfg, checkpoint, [given.paths[i] for i in held], given)
    buffer = io.BytesIO()
    np.savez(buffer, positions=held, probabilities=probs)
    atomic_write_bytes(done, buffer.getvalue())
    return held, probs


def fold_data(cfg, folder, given, positions):
    """The training part of a fold (the images at ``positions``) as train.py reads it:
    ``(data_path, label_file)``. Class folders: ``folder/images``, a class-folder root of
    links to them, and no label file; a label file: ``data_path`` and ``folder/train.csv``,
    their rows with the input's header (``write_fold_label_file``)."""
    if given.task.label_file:
        files = [relative_path(path, cfg.data_path) for path in given.paths]
        return cfg.data_path, write_fold_label_file(
            folder, header=given.header, files=files, given=given.label_texts,
            positions=positions, class_names=given.class_names)
    images = os.path.join(folder, "images")
    link_fold_images(list(zip(given.paths, given.labels)), positions, given.class_names, images)
    return images, ""


def predict_images(cfg, checkpoint, paths, given):
    """float32 (len(paths), C) probabilities of ``paths`` by ``checkpoint``, run as predict.py
    runs it (``fold_model``, ``load_predictor``, ``predict_in_batches``: the probabilities of
    the task its record names, softmax or per-class sigmoid).

    Raises:
        ConfigError: If the checkpoint records other class names than ``given``'s, or another
            task than the config's.
    """
    model, model_cfg, preprocess = fold_model(cfg, checkpoint)
    if model.class_names is not None and list(model.class_names) != given.class_names:
        raise ConfigError(f"{checkpoint} records other class names than {given.source} has "
                          f"({list(model.class_names)[:4]} ...)")
    if model.task_object is not given.task:
        raise ConfigError(f"{checkpoint} records task {model.task_object}, not task "
                          f"{given.task}")
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


def write_outputs(output_dir, *, rows, probs, given, summary, shown, data_path, exif_transpose):
    """``out_of_fold.npz`` (paths relative to ``data_path``, given labels: int (N,) or multi-hot
    uint8 (N, C), probabilities, class names), ``label_issues.csv`` and ``label_issues.html``,
    each atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, paths=np.array([relative_path(p, data_path) for p in given.paths]),
             labels=given.labels, probabilities=probs, class_names=np.array(given.class_names))
    atomic_write_bytes(os.path.join(output_dir, "out_of_fold.npz"), buffer.getvalue())
    csv_path = os.path.join(output_dir, "label_issues.csv")
    atomic_write_text(csv_path, issues_csv(rows))
    page = os.path.join(output_dir, "label_issues.html")
    atomic_write_text(page, issues_page(rows, summary=summary, labels=given.labels,
                                        class_names=given.class_names, shown=shown,
                                        exif_transpose=exif_transpose, task=given.task))
    summary.update(csv=csv_path, page=page)


if __name__ == "__main__":
    run_entry_point(main)

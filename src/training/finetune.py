"""The fine-tuning side of a training run (train.py): which stages train and LP-FT's switch
(``src.models.freeze``), the ``val_split`` lists and the class counts of the training images.
"""
from src.data.sampling import class_count_summary, class_counts
from src.data.split import (
    TRAIN_SPLIT_FILE,
    VAL_SPLIT_FILE,
    changed_split_files,
    held_out_fraction,
    split_image_folder,
    training_labels,
    write_split_files,
)
from src.models.freeze import count_parameters, never_trains, set_trainable_layers
from src.training.model import build_train_step, with_train_step
from src.training.resume import restore_training_state
from src.utils.config import ConfigError
from src.utils.device import apply_fusion_config

IMBALANCE_WARNING = 10  # largest / smallest class count above which a warning is logged


def check_split_and_balance(cfg):
    """Reject ``val_split``, ``class_balance`` and ``split_file`` values train.py cannot use
    (the ranges: ``check_values``; a class too small to split: ``split_image_folder``)."""
    if cfg.split_file:
        raise ConfigError(f"split_file {cfg.split_file} is read by eval.py only: train.py holds "
                          f"out part of data_path with val_split")
    for key, value, off in (("val_split", held_out_fraction(cfg), 0.0),
                            ("class_balance", cfg.class_balance, "none")):
        if cfg.dataset == "cifar10" and value != off:
            raise ConfigError(f"{key} {value} needs dataset imagefolder: the cifar10 binary "
                              f"release comes split (test_batch.bin, for eval_data_path) and "
                              f"balanced (5000 training images per class)")


def set_trainable(cfg, net, trainable_layers, freeze_bn, device_num, log):
    """Set which stages of ``net`` train (``src.models.freeze``), log how many parameters
    train, and in data parallel fuse the gradient all-reduce over the tensors that train."""
    set_trainable_layers(net, trainable_layers, freeze_bn)
    params = net.trainable_params()
    everything = [p for p in net.get_parameters() if not never_trains(p)]
    log.info("trainable_layers %d%s: %d of %d parameters train (%d of %d tensors)",
             trainable_layers, ", BatchNorm frozen" if freeze_bn else "",
             count_parameters(params), count_parameters(everything), len(params),
             len(everything))
    if device_num > 1:  # an explicit split is for the configured layers, not LP-FT's probe
        explicit = cfg.all_reduce_fusion_config if trainable_layers == cfg.trainable_layers else []
        fusion = apply_fusion_config(explicit, len(params), cfg.net_name)
        log.info("gradient all-reduce fused in groups split at %s of %d trainable tensors",
                 fusion, len(params))


def fine_tuning_model(cfg, model, lr, probe_end, amp_level, ema, device_num, log, resume_path=""):
    """LP-FT's switch at step ``probe_end`` (``linear_probe_epochs`` done): the stages of
    ``trainable_layers`` train from here, with a fresh optimizer over them (Kumar et al.
    2022, "Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution",
    arXiv:2202.10054: the probe's head initializes the fine-tuning) whose step 0 is the run's
    step ``probe_end`` (its LR array the rest of the run's). A new training cell, so its graph is
    compiled once more. The overflow count carries over; ``resume_path`` (a checkpoint after
    the switch) restores the new cell's optimizer state.

    Returns:
        Model: Training the new cell, evaluating the same network.
    """
    old = model.train_network
    net = old.network.backbone_network  # the cast network inside WithLossCell
    set_trainable(cfg, net, cfg.trainable_layers, cfg.freeze_bn, device_num, log)
    step = build_train_step(cfg, net, lr[probe_end:], amp_level, ema)
    step.overflow_count.set_data(old.overflow_count.value())
    if resume_path:
        restore_training_state(step, resume_path)
    log.info("LP-FT: linear probe done after %d steps; fine-tuning with trainable_layers %d "
             "from step %d", probe_end, cfg.trainable_layers, probe_end)
    return with_train_step(cfg, net, step, amp_level)


def checked_split(cfg, run, write):
    """The ``val_split`` of the run, checked against the lists an earlier part of the same run
    wrote (a resumed run whose split changed would train on images it held out before). A
    check only: nothing is written, so train.py calls it before writing any file.

    Args:
        cfg (Config): The run's config.
        run: ``continues_here``: the run continues a run of ``output_dir``.
        write (bool): This process writes the run's files (rank 0): it compares the lists.

    Returns:
        tuple: ``(split, changed)``: the ``FolderSplit`` (None without ``val_split`` or
        class folders) and the names of the lists it changes (only with
        ``resume_ignore_config``).

    Raises:
        ConfigError: If the split changed, unless ``resume_ignore_config``.
    """
    val_split = held_out_fraction(cfg)
    if cfg.dataset != "imagefolder" or not val_split:
        return None, []
    split = split_image_folder(cfg.data_path, val_split, cfg.seed)
    changed = changed_split_files(cfg.output_dir, cfg.data_path, split) if (
        write and run.continues_here) else []
    if changed and not cfg.resume_ignore_config:
        raise ConfigError(f"val_split {cfg.val_split} with seed {cfg.seed} now splits "
                          f"data_path {cfg.data_path} otherwise than {', '.join(changed)} "
                          f"in {cfg.output_dir}, written when this run started (another "
                          f"seed, or files added or removed): resuming would train on "
                          f"images held out before. Use the run's seed and data, or "
                          f"--resume_ignore_config true to resume with the new split")
    return split, changed


def record_training_images(cfg, run, class_names, write, log, checked=None):
    """Class folders: log the training images per class (one line; a warning when the
    largest class has more than ``IMBALANCE_WARNING`` times the images of the smallest)
    and, with ``val_split``, write the two parts' file lists into ``output_dir`` (if
    ``write``), ``TRAIN_SPLIT_FILE`` and ``VAL_SPLIT_FILE``.

    Args:
        checked (tuple, optional): What ``checked_split`` returned for this run, if called
            already (train.py: before any file is written); else it is called here.

    Raises:
        ConfigError: If this run continues a run of ``output_dir`` whose lists name other
            images (another seed, files added or removed: held-out images would be trained
            on), unless ``resume_ignore_config``.
        WriteError: If a list cannot be written.
    """
    if cfg.dataset != "imagefolder":
        return
    val_split = held_out_fraction(cfg)
    if cfg.val_split and not val_split:
        log.warning("val_split %g not applied: eval_data_path %s is given and wins (every image "
                    "of data_path trains)", cfg.val_split, cfg.eval_data_path)
    if val_split:
        split, changed = checked or checked_split(cfg, run, write)
        if changed:
            log.warning("resume_ignore_config: the split changed; %s rewritten",
                        ", ".join(changed))
        if write:
            write_split_files(cfg.output_dir, cfg.data_path, split)
        log.info("val_split %g: %d images train, %d held out%s (lists: %s, %s)",
                 cfg.val_split, len(split.train), len(split.val),
                 " for run_eval" if cfg.run_eval else "", TRAIN_SPLIT_FILE, VAL_SPLIT_FILE)
    counts = class_counts(training_labels(cfg.data_path, val_split, cfg.seed),
                          len(class_names))
    line, ratio = class_count_summary(counts, class_names)
    log.info("training images per class: %s", line)
    if ratio > IMBALANCE_WARNING:
        log.warning("unbalanced classes: the largest has %.1f times the images of the smallest"
                    "%s", ratio, "; class_balance sampler or loss evens them out"
                    if cfg.class_balance == "none" else "")

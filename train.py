"""Train a ResNet image classifier with MindSpore.

    python train.py --data_path /data/imagenet/train                  # ResNet-50, config.yaml
    python train.py --config_path configs/resnet18_cifar10.yaml --data_path DIR --epoch_size 5
    python train.py --config_path configs/multilabel_quick_start.yaml  # several labels per image

Reads top to bottom: config -> signals -> device -> output folder lock -> dataset -> network
-> LR -> Model (loss, optimizer, TrainStep, EMA) -> resume -> the last checks, callbacks ->
output folder (the first file written) -> training. Outputs in --output_dir:
docs/training.md#commands-and-outputs. One run per folder, resuming, stop signals and exit
statuses (0 done, 2 bad input, 3 non-finite or overflowing, 4 a file not written, 128 +
signal): docs/reliability.md.
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import json
import logging
import os

import numpy as np

from src.data import (
    CLASS_NAMES_FILE,
    ImageFolderError,
    readable_pipeline_errors,
    set_max_image_pixels,
    write_class_names,
)
from src.deploy import plot_confusion
from src.recipe import (
    TRAIN_SECTIONS,
    FineTuning,
    TrainData,
    build_data,
    build_evaluator,
    build_network,
    check_teacher_classes,
    check_train_config,
    distill_config,
    record_run_images,
    resolve_sink_size,
    run_split,
    score_key,
    step_recipe,
    task_defaults,
    train_plan,
    training_model,
    training_network,
    training_record,
    weights_config,
)
from src.training import (
    LR_KEYS,
    BestCheckpoint,
    CheckpointSaver,
    EarlyStop,
    EvalKeepingBest,
    OptimizerStepCallbacks,
    Patience,
    ProfileSteps,
    ResumedRun,
    StepState,
    StopSignals,
    TrainCallbacks,
    TrainMonitor,
    best_checkpoint_path,
    confusion_at_best,
    create_lr,
    ended_early,
    eval_shard,
    finish,
    lock_output_dir,
    loss_value,
    lr_group_tags,
    move_branch_aside,
    parse_profile_steps,
    prepare_output_dir,
    resolve_amp_level,
    resolve_loss_scale_type,
    resume_run,
    stored_score,
    track_run_end,
    train_run,
    trim_records,
    with_early_stop,
)
from src.utils import (
    TENSORBOARD_FOLDER,
    Config,
    TensorBoardLog,
    as_tensors,
    atomic_write_text,
    device,
    get_logger,
    get_task,
    init_distributed,
    own_checkpoints,
    parse_config,
    remove_stale_partials,
    run_entry_point,
    synthetic_batch,
    throughput_report,
    time_calls,
)

SECTIONS = TRAIN_SECTIONS


def main(argv: list[str] | None = None) -> int:
    """Train as configured by ``argv`` (default: the command line); returns the exit status
    (see the module docstring)."""
    # ---- config, signals (caught from here on), device ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(cfg.max_image_pixels)
    if not cfg.benchmark_steps:
        check_train_config(cfg)
    # resolved keys come as new configs: the task's defaults (benchmark_steps too: the loss
    # a multi-label recipe trains with), then the distillation loss's weights
    cfg = distill_config(task_defaults(cfg))
    stop = StopSignals(logging.getLogger("train"))
    stop.install()
    device.setup_device(cfg.mode, cfg.device_target, cfg.device_id, cfg.seed, cfg.run_distribute)
    rank, device_num = init_distributed(cfg.run_distribute, cfg.device_num)
    log = get_logger("train", None, rank)
    # Hub weights: their network unless net_name set; the run keeps its classes and settings
    cfg = weights_config(cfg, cfg.pre_trained, eval_settings=False)
    if cfg.benchmark_steps:
        return benchmark_training(cfg, device_num, log)
    lock = lock_output_dir(cfg.output_dir, rank, log)  # one run per folder, before any write

    # ---- data: the training pipeline's shape, class names ----
    data = build_data(cfg, rank, device_num)
    check_teacher_classes(cfg, data.class_names)  # a teacher of other classes is refused

    # ---- network, LR (per optimizer step), model: loss, optimizer, TrainStep, EMA ----
    net = build_network(cfg, device_num, log, rank)
    global_batch = cfg.batch_size * cfg.grad_accumulation_steps * device_num
    lr, peak_lr = create_lr(**{k: cfg[k] for k in LR_KEYS}, global_batch_size=global_batch,
                            steps_per_epoch=data.steps_per_epoch)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    # on GPU/Ascend, steps whose scaled gradients overflow are skipped and counted
    recipe = step_recipe(cfg, amp_level)
    model, ema = training_model(cfg, net, lr, amp_level, recipe)
    probe_end = cfg.linear_probe_epochs * data.steps_per_epoch  # LP-FT: fc alone until then
    fine_tune = FineTuning(cfg, recipe=recipe, lr=lr, probe_end=probe_end, ema=ema,
                           device_num=device_num, log=log) if probe_end else None

    # ---- resume (the same recipe, step of the data and of the LR) ----
    run_config = dict(cfg, device_num=device_num)
    if recipe.distill is not None:  # a resume with another teacher is refused
        run_config["kd_teacher_sha256"] = recipe.distill.digest
    run = resume_run(model.train_network, resume_ckpt=cfg.resume_ckpt, output_dir=cfg.output_dir,
                     prefix=cfg.net_name, run_config=run_config,
                     check_recipe=not cfg.resume_ignore_config, overwrite=cfg.overwrite,
                     epoch_size=cfg.epoch_size, steps_per_epoch=data.steps_per_epoch,
                     total_steps=len(lr), device_num=device_num, log=log,
                     train_images=data.train_images)
    if stopped_early(cfg, run, data.steps_per_epoch, log):  # nothing to train
        if lock:
            lock.release()
        return 0
    if probe_end and run.start_step >= probe_end:  # resumed after LP-FT's switch
        model = fine_tune(model, run.resume_path if run.start_step > probe_end else "")

    # ---- the last checks (nothing is written before they pass), callbacks: the step state
    # first, then the ones that read it; then the output folder ----
    sink_size = resolve_sink_size(cfg, data.steps_per_epoch)
    split = run_split(cfg, run.continues_here, rank == 0)
    record = training_record(cfg, data.class_names, recipe.loss_kwargs).to_json()
    callbacks = build_callbacks(cfg, run, data, model, net=net, ema=ema, lr=lr,
                                global_batch=global_batch, amp_level=amp_level, stop=stop,
                                rank=rank, log=log, record=record)
    log = prepare_run_folder(cfg, run, class_names=data.class_names, rank=rank, log=log,
                             split=split)
    log_run_summary(cfg, run, steps_per_epoch=data.steps_per_epoch, global_batch=global_batch,
                    device_num=device_num, peak_lr=peak_lr, total_steps=len(lr),
                    amp_level=amp_level, ema=ema, log=log)
    log.info("dataset sink mode: %s", f"{sink_size} steps per call" if sink_size else "off")

    # ---- train: step by step (each epoch its own pipeline) or in sink calls (one pipeline) ----
    try:
        with readable_pipeline_errors():
            train_run(model, callbacks, train_plan(cfg, data, sink_size), run.start_step, stop,
                      probe_end=probe_end, fine_tune=fine_tune)
    except ImageFolderError as err:  # an image the decoder rejects (check_images false)
        raise ImageFolderError(f"{err}; last good checkpoint: "
                               f"{callbacks.saver.last_saved or run.resume_path or 'none'} (resume "
                               f"from it with --resume_ckpt auto once the image is replaced)"
                               ) from err
    finally:
        stop.restore()
        if callbacks.profiler:
            callbacks.profiler.close()  # analyses the steps recorded before a stop
    status = finish(callbacks, stop, len(lr), cfg.output_dir, log)
    track_run_end(callbacks, cfg.output_dir, run.config)
    if lock:
        lock.release()
    return status


def stopped_early(cfg: Config, run: ResumedRun, steps_per_epoch: int,
                  log: logging.Logger) -> bool:
    """Whether the resumed checkpoint is where early stopping ended the run, and stays so
    (no larger ``early_stopping_patience`` given, no ``--overwrite``): then one line says so."""
    epoch, into = divmod(run.start_step, steps_per_epoch)
    stored = (run.best or {}).get("early_stop")
    if into or cfg.overwrite or not ended_early(
            stored, epoch, cfg.user_value("early_stopping_patience")):
        return False
    log.info("the run in %s stopped early after epoch %d (no improvement since epoch %d): "
             "nothing to train; best epoch %d, %s %.6g: %s; a larger "
             "--early_stopping_patience or --overwrite true trains on", cfg.output_dir, epoch,
             stored["epoch"], run.best["epoch"],
             ("ema_" if cfg.best_on_ema and cfg.ema_decay else "") + score_key(cfg),
             stored_score(run.best),
             best_checkpoint_path(cfg.output_dir, cfg.net_name))
    return True


def prepare_run_folder(cfg: Config, run: ResumedRun, *, class_names: list[str], rank: int,
                       log: logging.Logger, split=None) -> logging.Logger:
    """Make the output folder this run's, once every check has passed (a refused run leaves it
    as it was): on rank 0 refuse or move aside another run's files, move a branch's later
    files aside, remove unfinished saves and trim the records; then write the resolved
    config, the class names and ``split``'s lists (``src.recipe.run_split``). Returns the
    logger, on rank 0 now also writing ``train.log``.

    Raises:
        OutputDirError: If the folder holds another run's files.
        WriteError: If the config, class names or split lists cannot be written.
        ConfigError: If a resumed run's split differs from its earlier one.
    """
    is_main = rank == 0
    moved = branched = None
    if is_main:
        moved = prepare_output_dir(cfg.output_dir, not run.continues_here, cfg.overwrite,
                                   resume_auto=cfg.resume_ckpt == "auto")
        if run.later_files:
            branched = move_branch_aside(cfg.output_dir, run.later_files, run.start_step)
        for path in remove_stale_partials(cfg.output_dir, cfg.net_name):
            log.info("removed %s, left by a checkpoint save that did not finish", path)
        dropped = trim_records(cfg.output_dir, run.start_step) if run.continues_here else 0
        if dropped:
            log.info("metrics.jsonl: dropped %d record(s) after step %d, the resumed "
                     "checkpoint's (they are trained again)", dropped, run.start_step)
    os.makedirs(cfg.output_dir, exist_ok=True)
    log = get_logger("train", os.path.join(cfg.output_dir, "train.log") if is_main else None,
                     rank)
    log.info("resolved config:\n%s", cfg.to_yaml())
    if moved:
        log.warning("overwrite: the earlier run's files in %s were moved to %s",
                    cfg.output_dir, moved)
    if branched:
        log.warning("overwrite: resumed from step %d, before the run's newest checkpoint; its "
                    "later checkpoints and records were moved to %s", run.start_step, branched)
    if is_main:
        atomic_write_text(os.path.join(cfg.output_dir, "config.yaml"), cfg.to_yaml())
        write_class_names(os.path.join(cfg.output_dir, CLASS_NAMES_FILE), class_names)
    record_run_images(cfg, continues_here=run.continues_here, class_names=class_names,
                      write=is_main, log=log, checked=split)
    return log


def log_run_summary(cfg: Config, run: ResumedRun, *, steps_per_epoch: int, global_batch: int,
                    device_num: int, peak_lr: float, total_steps: int, amp_level: str, ema,
                    log: logging.Logger) -> None:
    """The run's batch, LR, precision and resume position, in the log."""
    accumulated = cfg.grad_accumulation_steps
    log.info("global batch %d (%d per device x %d devices%s): effective peak LR %.6g (base_lr "
             "%g per %d images); %d optimizer steps per epoch, %d in all", global_batch,
             cfg.batch_size, device_num, f" x {accumulated} accumulated micro-batches"
             if accumulated > 1 else "", peak_lr, cfg.base_lr, cfg.base_lr_batch_size,
             steps_per_epoch, total_steps)
    log.info("amp_level %s, loss scale %s, device %s; optimizer %s, loss %s%s", amp_level,
             f"{resolve_loss_scale_type(cfg.loss_scale_type, cfg.device_target)} "
             f"{cfg.loss_scale}" if amp_level != "O0" else "none", cfg.device_target,
             cfg.optimizer, cfg.loss, f", weight EMA decay {cfg.ema_decay}" if ema else "")
    if cfg.aug_repeats > 1:
        images = run.data["images"]
        log.info("aug_repeats %d: every image drawn is read %d times, each copy augmented on "
                 "its own; an epoch reads %d samples (%d per device), about %d distinct "
                 "images of the %d", cfg.aug_repeats, cfg.aug_repeats,
                 -(-images // device_num) * device_num, -(-images // device_num),
                 -(-images // cfg.aug_repeats), images)
    if run.resume_path:
        log.info("resumed from %s: %d steps done (epoch %d, step %d of %d)", run.resume_path,
                 run.start_step, run.start_step // steps_per_epoch + 1,
                 run.start_step % steps_per_epoch, steps_per_epoch)


def build_callbacks(cfg: Config, run: ResumedRun, data: TrainData, model, *, net, ema,
                    lr: np.ndarray, global_batch: int, amp_level: str, stop: StopSignals,
                    rank: int, log: logging.Logger, record: str = "") -> TrainCallbacks:
    """The callbacks of ``Model.train``, in order: the step state first, then the ones that read
    it (signals, progress and metrics with the evaluator and the best checkpoint, checkpoints,
    profiler). ``model`` is the training ``Model`` (evaluated), ``net`` its network, ``ema``
    its ``WeightEma`` or None, ``lr`` the per-step LR array; rank 0 writes the files;
    ``record`` (the model record, JSON) goes into every checkpoint.
    """
    is_main = rank == 0
    steps_per_epoch = data.steps_per_epoch
    evaluator = best = None
    if cfg.run_eval:
        best = BestCheckpoint(best_checkpoint_path(cfg.output_dir, cfg.net_name),
                              on_ema=cfg.best_on_ema and ema is not None, write=is_main,
                              task=get_task(cfg.task), model_record=record)
        best.restore(run.best, run.folder_best)  # the checkpoints' best, not metrics.jsonl's
        shard = eval_shard(cfg.eval_data_path or cfg.data_path, data.eval_args, **data.shards)
        evaluator = build_evaluator(cfg, model=model, net=net, ema=ema, shard=shard,
                                    amp_level=amp_level,
                                    confusion_of=best.metric if cfg.tensorboard else None)
    state = StepState(run.start_step, cfg.max_overflow_fraction, cfg.grad_accumulation_steps)
    tracker = (TensorBoardLog(os.path.join(cfg.output_dir, TENSORBOARD_FOLDER),
                              purge_step=run.start_step + 1, logger=log)
               if cfg.tensorboard and is_main else None)
    records = os.path.join(cfg.output_dir, "metrics.jsonl") if is_main else None
    lr_groups = lr_group_tags([p.name for p in net.get_parameters()], cfg.layer_decay,
                              cfg.head_lr_scale)
    monitor = TrainMonitor(
        state, lr=lr, global_batch_size=global_batch, steps_per_epoch=steps_per_epoch,
        log_interval=cfg.log_interval, metrics_path=records, logger=log,
        evaluator=EvalKeepingBest(evaluator, best) if best is not None else None,
        eval_interval=cfg.eval_interval, tracker=tracker, lr_groups=lr_groups,
        after_eval=confusion_at_best(tracker, evaluator, best, data.class_names,
                                     plot_confusion))
    patience = early = None
    if best is not None and cfg.early_stopping_patience:
        patience = Patience(cfg.early_stopping_patience, cfg.early_stopping_min_delta,
                            first_epoch=cfg.linear_probe_epochs, last_epoch=cfg.epoch_size,
                            task=get_task(cfg.task))
        patience.restore((run.best or {}).get("early_stop"),
                         restart_at=run.start_step // steps_per_epoch if cfg.overwrite else None)
        early = EarlyStop(patience, best, state, steps_per_epoch=steps_per_epoch,
                          metrics_path=records, logger=log, tracker=tracker)
    prunable = own_checkpoints(cfg.output_dir, cfg.net_name, steps_per_epoch,
                          run.start_step) if run.continues_here else []
    saver = CheckpointSaver(state, stop, output_dir=cfg.output_dir, prefix=cfg.net_name,
                            steps_per_epoch=steps_per_epoch, total_steps=len(lr),
                            run_config=json.dumps(run.config), model_record=record,
                            save_epochs=cfg.save_checkpoint_epochs,
                            save_steps=cfg.save_checkpoint_steps, keep_max=cfg.keep_checkpoint_max,
                            own_files=prunable, write=is_main,
                            best=with_early_stop(best.score, patience)
                            if best is not None else None,
                            train_data=json.dumps(run.data), epoch_loss=monitor.epoch_loss)
    monitor.resumed_loss = run.epoch_loss  # the epoch's losses before a mid-epoch resume
    profile = parse_profile_steps(cfg.profile_steps)
    profiler = ProfileSteps(state, *profile, output_dir=os.path.join(cfg.output_dir, "profiler"),
                            logger=log, total_steps=len(lr)) if profile else None
    on_steps = [stop, monitor] + ([early] if early else []) + [saver] + (
        [profiler] if profiler else [])
    agreement = stop.watch(state)  # after the saver: failures agreed at each epoch end
    return TrainCallbacks(state=state, monitor=monitor, saver=saver, profiler=profiler,
                          all=[state, OptimizerStepCallbacks(state, on_steps, [stop.install]),
                               agreement])


def benchmark_training(cfg: Config, device_num: int, log: logging.Logger) -> int:
    """``--benchmark_steps N``: N optimizer steps of the configured recipe on one synthetic
    batch of ``batch_size`` that stays on the device (``src.utils.throughput``), fed
    ``grad_accumulation_steps`` times per step; no dataset, no files. Returns 0."""
    net = training_network(cfg)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    step = training_model(cfg, net, cfg.base_lr, amp_level)[0].train_network
    step.set_train()
    images_per_step = cfg.batch_size * cfg.grad_accumulation_steps
    images, labels = as_tensors(*synthetic_batch(
        cfg.batch_size, cfg.train_image_size, cfg.class_num,
        soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha) or get_task(cfg.task).multi_hot))
    log.info("benchmark_steps %d: %s, %d images per step per device at %d px, amp_level %s, "
             "%d device(s); data_path not read, nothing written", cfg.benchmark_steps,
             cfg.net_name, images_per_step, cfg.train_image_size, amp_level, device_num)
    def optimizer_step():
        for _ in range(cfg.grad_accumulation_steps - 1):
            step(images, labels)
        return loss_value(step(images, labels))

    warmup, timed = time_calls(optimizer_step, cfg.benchmark_steps)
    record, line = throughput_report("train", images_per_step, device_num, warmup, timed)
    record["optimizer_steps"] = int(step.optimizer.global_step.asnumpy().reshape(-1)[0])
    log.info("%s", line)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    run_entry_point(main)

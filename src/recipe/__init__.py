"""The recipe: the one place below the entry points that reads the config (``Config``). Its
adapters turn config keys into the library's plain arguments (timm's ``optimizer_kwargs``
style), one concern per module: ``checks``, ``network``, ``optimization``, ``data``, ``splits``,
``model_record``, ``label_issues``. Imported by the entry points, benchmarks and tests only.
``serving`` (serve.py's adapters) is not re-exported: it imports the web stack, which the other
entry points need not.
"""
from src.recipe.checks import (
    TRAIN_SECTIONS,
    UNUSED_KEYS,
    UnusedKey,
    check_optimizer_keys,
    check_split_and_balance,
    check_task,
    check_train_config,
    check_unused_keys,
    resolve_sink_size,
    score_key,
    task_defaults,
)
from src.recipe.data import (
    TRAIN_AUGMENT_KEYS,
    TrainData,
    batch_mixer,
    build_data,
    epoch_dataset,
    eval_preprocess,
    run_dataset,
    train_augment,
    train_plan,
    training_pipeline,
)
from src.recipe.label_issues import (
    EVALUATION_KEYS,
    LABEL_ISSUES_SECTIONS,
    OWN_KEYS,
    RECIPE_FILE,
    GivenLabels,
    assign_folds,
    changed_training_keys,
    check_label_issues_config,
    drop_evaluation_keys,
    fold_model,
    fold_recipe,
    given_labels,
)
from src.recipe.model_record import (
    check_teacher_classes,
    checkpoint_digest,
    model_config,
    model_preprocess,
    resolve_model,
    training_record,
    weights_config,
)
from src.recipe.network import (
    FineTuning,
    build_network,
    make_trainable,
    network_kwargs,
    training_network,
)
from src.recipe.optimization import (
    build_evaluator,
    distill_config,
    distill_loss_weights,
    distillation,
    loss_class_weights,
    loss_kwargs,
    optimizer_kwargs,
    step_recipe,
    training_model,
)
from src.recipe.splits import (
    check_positive_labels,
    data_split,
    eval_label_table,
    held_out,
    label_classes,
    label_table,
    label_tables,
    multilabel_pos_weight,
    record_label_file_images,
    record_run_images,
    run_split,
    split_indices,
)

__all__ = [
    # checks
    "TRAIN_SECTIONS", "UNUSED_KEYS", "UnusedKey", "check_optimizer_keys",
    "check_split_and_balance", "check_task", "check_unused_keys",
    "check_train_config", "resolve_sink_size", "score_key", "task_defaults",
    # data
    "TRAIN_AUGMENT_KEYS", "TrainData", "batch_mixer", "build_data", "epoch_dataset",
    "eval_preprocess", "run_dataset", "train_augment", "train_plan", "training_pipeline",
    # label_issues
    "EVALUATION_KEYS", "LABEL_ISSUES_SECTIONS", "OWN_KEYS", "RECIPE_FILE", "GivenLabels",
    "assign_folds", "changed_training_keys", "check_label_issues_config",
    "drop_evaluation_keys", "fold_model", "fold_recipe", "given_labels",
    # model_record
    "check_teacher_classes", "checkpoint_digest", "model_config",
    "model_preprocess", "resolve_model", "training_record", "weights_config",
    # network
    "FineTuning", "build_network", "make_trainable", "network_kwargs", "training_network",
    # optimization
    "build_evaluator", "distill_config", "distill_loss_weights", "distillation",
    "loss_class_weights", "loss_kwargs", "optimizer_kwargs",
    "step_recipe", "training_model",
    # splits
    "check_positive_labels", "data_split", "eval_label_table", "held_out", "label_classes",
    "label_table", "label_tables",
    "multilabel_pos_weight", "record_label_file_images", "record_run_images", "run_split",
    "split_indices",
]

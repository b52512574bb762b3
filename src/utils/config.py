"""Configuration: ``config.yaml`` defaults, an optional recipe file, then ``--key value`` flags.

``config.yaml`` (at the repository root) is both the default recipe and the schema: its first
YAML document gives every key with its default value (whose type is the key's type), the
second the meaning and unit of each key (printed by ``--help``), the third the allowed values
of keys with a closed set. Same layout as ModelZoo's ``*_config.yaml`` files.

Override order, later wins: ``config.yaml`` < ``--config_path FILE`` < command-line flags.

A recipe file (``--config_path``) is one YAML document of ``key: value`` lines, each key once. A
copy of config.yaml is accepted too: its second and third documents, help texts (strings) and
choices (lists), are not read. A ``config_path`` key (a run's written config.yaml records its
recipe there) is ignored: re-running a run from its config.yaml works.
"""
import argparse
import logging
import math
import os
import re

import yaml

from src.utils.errors import UserError
from src.utils.image_constants import (
    MAGNITUDE_BINS,
    RANDAUGMENT_MAX_MAGNITUDE,
    RANDAUGMENT_MAX_OPS,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = os.path.join(ROOT, "config.yaml")
TRUE_WORDS = {"true", "yes", "1", "on"}
FALSE_WORDS = {"false", "no", "0", "off"}
POSITIVE = ("batch_size", "epoch_size", "class_num", "train_image_size", "eval_image_size",
            "eval_resize", "grad_accumulation_steps", "log_interval",
            "save_checkpoint_epochs", "keep_checkpoint_max", "base_lr_batch_size", "base_lr",
            "eval_interval", "top_k", "num_parallel_workers", "loss_scale", "eps",
            "calibration_images", "scale_window", "max_image_pixels", "head_lr_scale",
            "trust_coeff", "lr_poly_power")
"""Keys whose value must be > 0, checked for every entry point (``check_values``)."""
NON_NEGATIVE = ("save_checkpoint_steps", "warmup_epochs", "momentum", "weight_decay",
                "lr_end", "label_smoothing", "device_id", "benchmark_steps", "sink_size",
                "randaugment_num_ops", "mixup_alpha", "cutmix_alpha", "grad_clip_norm",
                "linear_probe_epochs", "aug_repeats")
"""Keys whose value must be >= 0."""
UNIT_INTERVAL = {"random_erasing": "[0, 1]", "mix_prob": "[0, 1]", "mix_switch_prob": "[0, 1]",
                 "label_smoothing": "[0, 1)", "ema_decay": "[0, 1)", "beta1": "[0, 1)",
                 "beta2": "[0, 1)", "bce_target_threshold": "[0, 1)",
                 "max_overflow_fraction": "[0, 1]", "layer_decay": "(0, 1]",
                 "val_split": "[0, 1)", "drop_path_rate": "[0, 1)"}
"""Keys whose value must lie in the given interval of [0, 1]."""
INT32_MAX = 2 ** 31 - 1
FLOAT32_MAX = 3.4028234663852886e+38
UPPER_BOUNDS = {
    "epoch_size": (INT32_MAX, "MindSpore's optimizer step counter is int32"),
    "seed": (2 ** 32 - 1, "MindSpore's seed range"),
    "device_id": (4095, "MindSpore's device_id range"),
    "class_num": (2 ** 20, "the ResNet-50 classifier alone is then 8 GiB"),
    "batch_size": (2 ** 16, "per device"),
    "train_image_size": (4096, "pixels per side"),
    "eval_image_size": (4096, "pixels per side"),
    "eval_resize": (4096, "pixels per side"),
    "aug_repeats": (64, "copies of each image drawn; an epoch sees 1/aug_repeats of the images, "
                        "published recipes use 3 (DeiT) and 4 (torchvision)"),
}
"""Keys with an upper bound of their own: key -> (bound, why). Every other integer (list items
included) is at most ``INT32_MAX`` (MindSpore's counters and op attributes are int32), every
float at most ``FLOAT32_MAX`` in magnitude (values reach the network as float32)."""
RECIPE_IGNORED = ("config_path",)
"""Keys a recipe file may hold that are not config keys: a run's written config.yaml records
the recipe it was resolved from as ``config_path``."""
RENAMED = {"image_size": "train_image_size (training crop) and eval_image_size (eval, export, "
                         "predict)"}
"""Keys of earlier versions and what replaced them, named in the unknown-key error."""
SECTION = re.compile(r"^# -+ (.+?) -+$")
LOGGER = logging.getLogger(__name__)


class ConfigError(UserError, ValueError):
    """A config file or flag is malformed, names an unknown key, or has a wrong value."""


class Config(dict):
    """A resolved configuration: a dict whose keys are also attributes (``cfg.batch_size``).

    Attributes:
        user_keys (frozenset[str]): The keys the user set, in the recipe file
            (``--config_path``) or on the command line; the others hold config.yaml's default.
    """

    user_keys = frozenset()

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}") from None

    def to_yaml(self):
        """Return the config as YAML text, keys in schema order."""
        return yaml.safe_dump(dict(self), sort_keys=False, default_flow_style=None)

    def user_value(self, key):
        """The value of ``key`` if the user set it (``user_keys``), else None."""
        return self[key] if key in self.user_keys else None

    def fill_unset(self, values, origin=None):
        """Set the keys of ``values`` that the user did not set (``user_keys``); with
        ``origin``, log one line saying which values were taken from it and which the user's
        set values overrode.

        Args:
            values (dict): Key -> value, e.g. the eval settings of pretrained weights.
            origin (str, optional): Where ``values`` come from, for the log line.

        Returns:
            tuple(dict, dict): the values taken, and the user's values kept instead of
            ``values``' (those that differ), each key -> value.
        """
        taken = {k: v for k, v in values.items() if k not in self.user_keys}
        kept = {k: self[k] for k, v in values.items() if k in self.user_keys and self[k] != v}
        self.update(taken)
        if origin and (taken or kept):
            LOGGER.info("%s: %s%s", origin,
                        "taken from it: " + ", ".join(f"{k} {v}" for k, v in taken.items())
                        if taken else "nothing taken from it",
                        "; kept as set: " + ", ".join(f"{k} {v} (it gives {values[k]})"
                                                      for k, v in kept.items()) if kept else "")
        return taken, kept


def load_schema(path=DEFAULT_CONFIG):
    """Read the schema file: (defaults, help texts, choices).

    Raises:
        ConfigError: If the file does not hold the three documents or a key lacks help.
    """
    docs = _read_yaml_documents(path)
    if len(docs) != 3:
        raise ConfigError(f"{path}: expected 3 YAML documents (values, help, choices), "
                          f"found {len(docs)}")
    defaults, helps, choices = docs
    missing = [key for key in defaults if key not in helps]
    if missing:
        raise ConfigError(f"{path}: no help text for keys {missing}")
    return defaults, helps, choices


class _DuplicateKey(Exception):
    """A mapping of a YAML file gives a key twice: (key, first line, second line)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    silently). The keys of a merge (``<<: *anchor``) may be overridden: that is their use."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: the base class names it
                    continue
                if first is not None:
                    raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
                lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _read_yaml_documents(path, starts=None):
    """The documents of the YAML file ``path``, each a mapping (an empty one for an empty
    document). ``starts``, if a list, receives the 1-based line of each document's start."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    loader = None
    with open(path, encoding="utf-8") as f:
        docs = []
        try:
            loader = _UniqueKeyLoader(f)
            while loader.check_node():
                node = loader.get_node()
                if starts is not None:
                    starts.append(node.start_mark.line + 1)
                doc = loader.construct_document(node)
                docs.append(doc if doc is not None else {})
        except _DuplicateKey as err:
            key, first, second = err.args
            raise ConfigError(f"{path}: key {key!r} is given twice (lines {first} and "
                              f"{second}): keep one") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at "
                              f"offset {err.start}): save the file as UTF-8") from err
        finally:
            if loader is not None:
                loader.dispose()
    for doc in docs:
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: expected a mapping of key: value, got {type(doc).__name__}")
    return docs


def read_recipe(path):
    """The ``key: value`` mapping of the recipe file ``path`` (``--config_path``).

    One YAML document; a copy of config.yaml (three documents, the second of help texts, the
    third of choices) gives its first. ``RECIPE_IGNORED`` keys are dropped.

    Raises:
        ConfigError: For a file of several documents otherwise (only the first would be
            read), naming the file, the count and where the second starts; as
            ``_read_yaml_documents``.
    """
    starts = []
    docs = _read_yaml_documents(path, starts) or [{}]
    if len(docs) > 1 and not _is_schema_copy(docs):
        raise ConfigError(f"{path} holds {len(docs)} YAML documents (the second starts at line "
                          f"{starts[1]}): a recipe is one document of key: value lines, only the "
                          f"first would be read; merge them into one")
    return {k: v for k, v in docs[0].items() if k not in RECIPE_IGNORED}


def _is_schema_copy(docs):
    """Whether ``docs`` have config.yaml's layout: values, help texts (strings), choices
    (lists)."""
    return (len(docs) == 3 and all(isinstance(v, str) for v in docs[1].values())
            and all(isinstance(v, list) for v in docs[2].values()))


def coerce(key, value, default, source):
    """Convert ``value`` to the type of ``default`` (the key's type in config.yaml).

    Strings (command-line flags, and YAML scalars such as ``1e-4`` that PyYAML reads as
    strings) are parsed; other values must already have the right type. An int is accepted
    for a float key.

    Args:
        key (str): Config key, for the error message.
        value: The new value (str from the command line, any YAML type from a file).
        default: The key's default, whose type is the expected type.
        source (str): Where the value came from (file name or "command line").

    Returns:
        The value converted to the key's type.

    Raises:
        ConfigError: If the value cannot be read as the key's type; names key and source.
    """
    expected = type(default)
    try:
        if isinstance(value, str) and expected is not str:
            value = _parse_string(value, default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if expected is list:
            value = _coerce_list(value, default)
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise TypeError
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: key {key!r} expects {_type_name(default)}, "
                          f"got {value!r}") from None
    return value


def _parse_string(text, default):
    if isinstance(default, bool):
        word = text.strip().lower()
        if word not in TRUE_WORDS | FALSE_WORDS:
            raise ValueError(text)
        return word in TRUE_WORDS
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    if isinstance(default, list):
        return yaml.safe_load(text if text.strip().startswith("[") else f"[{text}]")
    raise TypeError(text)


def _coerce_list(value, default):
    """Check every item against the type of the default's items; ints become floats."""
    if not isinstance(value, list):
        raise TypeError(value)
    item_type = type(default[0]) if default else int
    items = []
    for item in value:
        if isinstance(item, str) and item_type is not str:
            item = item_type(item)
        if item_type is float and isinstance(item, int) and not isinstance(item, bool):
            item = float(item)
        if not isinstance(item, item_type) or isinstance(item, bool):
            raise TypeError(item)
        items.append(item)
    return items


def _type_name(default):
    if isinstance(default, list):
        item_type = type(default[0]).__name__ if default else "int"
        return f"a list of {item_type} (e.g. 85,160)"
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number",
            str: "a string"}[type(default)]


def merge(cfg, updates, defaults, choices, source):
    """Apply ``updates`` to ``cfg`` in place, checking key names, types and choices.

    Raises:
        ConfigError: For an unknown key (with the closest valid keys), a wrong type, or a
            value outside the key's choices.
    """
    for key, value in updates.items():
        if key in RENAMED and key not in defaults:
            raise ConfigError(f"{source}: config key {key!r} was replaced by {RENAMED[key]}")
        if key not in defaults:
            raise ConfigError(f"{source}: unknown config key {key!r}; "
                              f"valid keys: {', '.join(defaults)}")
        value = coerce(key, value, defaults[key], source)
        if key in choices and value not in choices[key]:
            raise ConfigError(f"{source}: key {key!r} must be one of {choices[key]}, "
                              f"got {value!r}")
        cfg[key] = value


def read_sections(path=DEFAULT_CONFIG):
    """The sections of the schema file: ``# ---- name ----`` comment lines, each followed by
    its keys.

    Returns:
        dict[str, list[str]]: section name -> keys, in file order.
    """
    sections, current = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("---"):
                break
            header = SECTION.match(line.strip())
            if header:
                current = sections.setdefault(header.group(1), [])
            elif current is not None and re.match(r"^\w+:", line):
                current.append(line.split(":", 1)[0])
    return sections


def build_parser(defaults, helps, description, sections=None, shown=None):
    """An ``argparse`` parser with one ``--key`` flag per config key (value read as text).

    Args:
        defaults (dict): Key -> default value.
        helps (dict): Key -> help text.
        description (str): Shown first by ``--help``.
        sections (dict[str, list[str]], optional): Section -> keys (``read_sections``).
        shown (tuple[str], optional): The sections whose keys ``--help`` lists, grouped;
            the other keys are accepted (recipe files and launch scripts pass them to every
            entry point) but not listed. None: all sections.
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Values are checked against the types of config.yaml. Lists: --key 85,160."
               + ("" if shown is None else " Keys of other sections are accepted and ignored "
                                           "(see config.yaml)."))
    parser.add_argument("--config_path", default=DEFAULT_CONFIG,
                        help="YAML recipe whose keys override config.yaml (e.g. configs/*.yaml)")
    sections = dict(sections or {})
    grouped = {k for keys in sections.values() for k in keys}
    sections["other"] = [k for k in defaults if k not in grouped]
    for name, keys in sections.items():
        listed = shown is None or name in shown or name == "other"
        group = parser.add_argument_group(name) if listed else parser
        for key in (k for k in keys if k in defaults):
            group.add_argument(f"--{key}", default=argparse.SUPPRESS,
                               metavar=_metavar(defaults[key]),
                               help=f"{helps[key]} (default: {defaults[key]!r})" if listed
                               else argparse.SUPPRESS)
    return parser


def _metavar(default):
    return type(default).__name__.upper() if not isinstance(default, list) else "LIST"


def check_values(cfg):
    """Range checks shared by every entry point: every float finite (``nan`` and ``inf`` pass
    no comparison-based check) and within its upper bound (``check_upper_bounds``; the seed
    in MindSpore's range), ``POSITIVE`` keys > 0, ``NON_NEGATIVE`` keys >= 0,
    ``UNIT_INTERVAL`` keys in their interval, ``train_crop_scale`` a [min, max] area range.

    Raises:
        ConfigError: Naming the key, its value and what was expected.
    """
    for key, value in cfg.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}")
        if isinstance(value, list) and any(isinstance(v, float) and not math.isfinite(v)
                                           for v in value):
            raise ConfigError(f"{key} must hold finite numbers, got {value}")
    check_upper_bounds(cfg)
    for key in POSITIVE:
        if cfg[key] <= 0:
            kind = "a positive integer" if isinstance(cfg[key], int) else "positive"
            raise ConfigError(f"{key} must be {kind}, got {cfg[key]}")
    for key in NON_NEGATIVE:
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be 0 or positive, got {cfg[key]}")
    for key, interval in UNIT_INTERVAL.items():
        if (not 0 <= cfg[key] <= 1 or (interval.endswith(")") and cfg[key] == 1)
                or (interval.startswith("(") and cfg[key] == 0)):
            raise ConfigError(f"{key} must be in {interval}, got {cfg[key]}")
    if cfg.scale_factor <= 1:
        raise ConfigError(f"scale_factor must be > 1, got {cfg.scale_factor}")
    if not 0 <= cfg.trainable_layers <= 5:
        raise ConfigError(f"trainable_layers must be in 0..5 (0 = only fc, 5 = every layer), "
                          f"got {cfg.trainable_layers}")
    if not 0 <= cfg.randaugment_num_ops <= RANDAUGMENT_MAX_OPS:
        raise ConfigError(f"randaugment_num_ops must be in 0..{RANDAUGMENT_MAX_OPS}, got "
                          f"{cfg.randaugment_num_ops}")
    if not 0 <= cfg.randaugment_magnitude <= RANDAUGMENT_MAX_MAGNITUDE:
        raise ConfigError(f"randaugment_magnitude must be in 0..{RANDAUGMENT_MAX_MAGNITUDE} "
                          f"({MAGNITUDE_BINS} bins), got {cfg.randaugment_magnitude}")
    low, high = (cfg.train_crop_scale + [None, None])[:2]
    if len(cfg.train_crop_scale) != 2 or not 0 < low <= high <= 1:
        raise ConfigError(f"train_crop_scale must be [min, max] with 0 < min <= max <= 1, got "
                          f"{cfg.train_crop_scale}")


def check_upper_bounds(cfg):
    """``UPPER_BOUNDS``, ``INT32_MAX`` for the other integers (list items included) and
    ``FLOAT32_MAX`` for every float: a value beyond them fails in MindSpore (a seed) or
    allocates without end (an LR array of ``epoch_size`` x steps per epoch values).

    Raises:
        ConfigError: Naming the key, the bound and why, and the value.
    """
    if cfg["seed"] < 0 or cfg["seed"] > UPPER_BOUNDS["seed"][0]:
        raise ConfigError(f"seed must be in 0..{UPPER_BOUNDS['seed'][0]} "
                          f"({UPPER_BOUNDS['seed'][1]}), got {cfg['seed']}")
    for key, value in cfg.items():
        if key in UPPER_BOUNDS:
            bound, why = UPPER_BOUNDS[key]
            if value > bound:
                raise ConfigError(f"{key} must be at most {bound} ({why}), got {value}")
        elif isinstance(value, int) and not isinstance(value, bool) and value > INT32_MAX:
            raise ConfigError(f"{key} must be at most {INT32_MAX} (int32), got {value}")
        elif isinstance(value, float) and abs(value) > FLOAT32_MAX:
            raise ConfigError(f"{key} must be at most {FLOAT32_MAX} in magnitude (float32), "
                              f"got {value}")
        elif isinstance(value, list) and any(
                isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT32_MAX
                for v in value):
            raise ConfigError(f"{key} must hold integers of at most {INT32_MAX} (int32), got "
                              f"{value}")
        elif isinstance(value, list) and any(isinstance(v, float) and abs(v) > FLOAT32_MAX
                                             for v in value):
            raise ConfigError(f"{key} must hold numbers of at most {FLOAT32_MAX} in magnitude "
                              f"(float32), got {value}")


def parse_config(argv=None, description="ResNet on MindSpore", schema_path=DEFAULT_CONFIG,
                 sections=None):
    """Resolve the configuration of an entry point.

    Args:
        argv (list[str], optional): Command-line arguments (default: ``sys.argv[1:]``).
        description (str): Shown by ``--help``.
        schema_path (str): The schema/defaults file (``config.yaml``).
        sections (tuple[str], optional): The config.yaml sections this entry point reads:
            ``--help`` lists their keys only, grouped (None: every key).

    Returns:
        Config: every key of config.yaml with its resolved, type-checked value, plus
        ``config_path``; ``user_keys`` names those set in the recipe file or the flags.

    Raises:
        ConfigError: For an unknown key, a value of the wrong type, outside its choices or
            its range (``check_values``), in the recipe file or on the command line.
            (``--help`` and flag syntax errors exit through argparse.)
    """
    defaults, helps, choices = load_schema(schema_path)
    parser = build_parser(defaults, helps, description, read_sections(schema_path), sections)
    args = parser.parse_args(argv)
    flags = vars(args)
    config_path = flags.pop("config_path")
    cfg = Config(defaults)
    recipe = {}
    if os.path.abspath(config_path) != os.path.abspath(schema_path):
        recipe = read_recipe(config_path)
        merge(cfg, recipe, defaults, choices, config_path)
    merge(cfg, flags, defaults, choices, "command line")
    check_values(cfg)
    cfg["config_path"] = config_path
    cfg.user_keys = frozenset(recipe) | frozenset(flags)
    return cfg

"""Configuration: ``config.yaml`` (defaults, help texts, choices: ModelZoo's layout) < a recipe
file (``--config_path``) < ``--key value`` flags. See docs/configuration.md#setting-values.
"""
import argparse
import copy
import logging
import math
import os
import re

import yaml

from src.utils.errors import UserError
from src.utils.limits import (
    AUG_REPEATS_MAX,
    BATCH_SIZE_MAX,
    CAM_IMAGES_MAX,
    CLASS_NUM_MAX,
    DEVICE_ID_MAX,
    FLOAT32_MAX,
    IMAGE_SIDE_MAX,
    INT32_MAX,
    MAGNITUDE_BINS,
    MAX_TRAINABLE_LAYERS,
    RANDAUGMENT_MAX_MAGNITUDE,
    RANDAUGMENT_MAX_OPS,
    SEED_MAX,
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
            "trust_coeff", "lr_poly_power", "kd_temperature")
"""Keys whose value must be > 0."""
NON_NEGATIVE = ("save_checkpoint_steps", "warmup_epochs", "momentum", "weight_decay",
                "lr_end", "label_smoothing", "device_id", "benchmark_steps", "sink_size",
                "randaugment_num_ops", "mixup_alpha", "cutmix_alpha", "grad_clip_norm",
                "linear_probe_epochs", "aug_repeats", "cam_images",
                "early_stopping_patience", "distill_loss_weight", "task_loss_weight",
                "asl_gamma_neg", "asl_gamma_pos")
"""Keys whose value must be >= 0."""
UNIT_INTERVAL = {"random_erasing": "[0, 1]", "mix_prob": "[0, 1]", "mix_switch_prob": "[0, 1]",
                 "label_smoothing": "[0, 1)", "ema_decay": "[0, 1)", "beta1": "[0, 1)",
                 "beta2": "[0, 1)", "bce_target_threshold": "[0, 1)",
                 "max_overflow_fraction": "[0, 1]", "layer_decay": "(0, 1]",
                 "val_split": "[0, 1)", "drop_path_rate": "[0, 1)",
                 "early_stopping_min_delta": "[0, 1)", "asl_clip": "[0, 1)",
                 "ood_tpr": "(0, 1)"}
"""Keys whose value must lie in the given interval of [0, 1]."""
UPPER_BOUNDS = {
    "epoch_size": (INT32_MAX, "MindSpore's optimizer step counter is int32"),
    "seed": (SEED_MAX, "MindSpore's seed range"),
    "device_id": (DEVICE_ID_MAX, "MindSpore's device_id range"),
    "class_num": (CLASS_NUM_MAX, "the ResNet-50 classifier alone is then 8 GiB"),
    "batch_size": (BATCH_SIZE_MAX, "per device"),
    "train_image_size": (IMAGE_SIDE_MAX, "pixels per side"),
    "eval_image_size": (IMAGE_SIDE_MAX, "pixels per side"),
    "eval_resize": (IMAGE_SIDE_MAX, "pixels per side"),
    "aug_repeats": (AUG_REPEATS_MAX, "copies of each image drawn; an epoch sees 1/aug_repeats of "
                                     "the images, published recipes use 3 (DeiT) and 4 "
                                     "(torchvision)"),
    "cam_images": (CAM_IMAGES_MAX, "Grad-CAM pictures written by eval.py"),
}
"""Key -> (upper bound, why); other ints are at most ``INT32_MAX``, floats ``FLOAT32_MAX``."""
INT_RANGES = {"trainable_layers": (0, MAX_TRAINABLE_LAYERS,
                                  f" (0 = only fc, {MAX_TRAINABLE_LAYERS} = every layer)"),
              "cam_class": (-1, CLASS_NUM_MAX - 1, " (-1 = the predicted class)")}
"""Integer keys checked to lie in low..high: key -> (low, high, note for the error)."""
NULL_DEFAULT_TYPES = {"momentum": float, "beta1": float, "beta2": float, "eps": float,
                      "trust_coeff": float}
"""Keys whose default is null (unset: the chosen optimizer's own default, ``OPTIMIZERS`` in
src/training/optimizer.py) -> the type of the values they take; null (``~`` or ``null`` in YAML,
``--key null``) unsets them again."""
NULL_WORDS = ("null", "~")
"""The text of null on the command line (YAML's words for it)."""
RECIPE_IGNORED = ("config_path",)
"""Non-config keys a recipe may hold (a run's written config.yaml records ``config_path``)."""
RENAMED = {"image_size": "train_image_size (training crop) and eval_image_size (eval, export, "
                         "predict)"}
"""Keys of earlier versions and what replaced them, named in the unknown-key error."""
ConfigValue = bool | int | float | str | list | None
"""The type of a config value: that of its default in config.yaml (``NULL_DEFAULT_TYPES``'s for a
null default), or None for an unset key of ``NULL_DEFAULT_TYPES``."""
SECTION = re.compile(r"^# -+ (.+?) -+$")
LOGGER = logging.getLogger(__name__)


class ConfigError(UserError, ValueError):
    """A config file or flag is malformed, names an unknown key, or has a wrong value."""


class Config(dict):
    """A resolved configuration, read-only: a dict whose keys are also attributes
    (``cfg.batch_size``); ``user_keys`` are those set in the recipe file or on the command
    line, ``defaults`` config.yaml's values. A key is resolved into a new config
    (``replaced``, ``with_unset``), as timm's ``resolve_data_config`` returns a new dict.

    Raises:
        TypeError: On any write (``cfg[key] = v``, ``update``, ``cfg.key = v``, ...), naming
            the way to a new config.
    """

    def __init__(self, values=(), /, *, user_keys: frozenset[str] = frozenset(),
                 defaults: dict[str, ConfigValue] | None = None, **more: ConfigValue):
        dict.__init__(self, values, **more)
        object.__setattr__(self, "user_keys", frozenset(user_keys))
        object.__setattr__(self, "defaults", {} if defaults is None else defaults)

    def _read_only(self, *args, **kwargs):
        raise TypeError("a Config is read-only: resolve a key into a new one with "
                        "cfg.replaced(key=value) or cfg.with_unset(values)")

    __setitem__ = __delitem__ = __setattr__ = __delattr__ = __ior__ = _read_only
    update = pop = popitem = clear = setdefault = _read_only

    def __reduce__(self):  # copy, deepcopy and pickle: a new Config, never a write
        return (_config_of, (dict(self), self.user_keys, self.defaults))

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}") from None

    def to_yaml(self) -> str:
        """Return the config as YAML text, keys in schema order."""
        return yaml.dump(dict(self), Dumper=_ConfigDumper, sort_keys=False,
                         default_flow_style=None)

    def user_value(self, key: str) -> ConfigValue | None:
        """The value of ``key`` if the user set it (``user_keys``), else None."""
        return self[key] if key in self.user_keys else None

    def set_otherwise(self, key: str) -> bool:
        """Whether the user set ``key`` (``user_keys``) to another value than its default."""
        return key in self.user_keys and self[key] != self.defaults.get(key)

    def replaced(self, *, user_keys: frozenset[str] | None = None,
                 **values: ConfigValue) -> "Config":
        """A new config: this one with ``values`` (resolved values, not the user's: the new
        config keeps ``user_keys``, or takes the ones given, and ``defaults``); this one is
        unchanged."""
        return Config(dict(self, **values), defaults=self.defaults,
                      user_keys=self.user_keys if user_keys is None else user_keys)

    def with_unset(self, values: dict[str, ConfigValue], origin: str | None = None
                   ) -> "Config":
        """A new config: this one with the keys of ``values`` the user did not set taken from
        ``values`` (``replaced``); the user's keys keep their values. With ``origin``, log one
        line naming those taken and the user's differing values kept."""
        taken = {k: v for k, v in values.items() if k not in self.user_keys}
        kept = {k: self[k] for k, v in values.items() if k in self.user_keys and self[k] != v}
        if origin and (taken or kept):
            LOGGER.info("%s: %s%s", origin,
                        "taken from it: " + ", ".join(f"{k} {v}" for k, v in taken.items())
                        if taken else "nothing taken from it",
                        "; kept as set: " + ", ".join(f"{k} {v} (it gives {values[k]})"
                                                      for k, v in kept.items()) if kept else "")
        return self.replaced(**taken)


def _config_of(values: dict, user_keys: frozenset[str], defaults: dict) -> Config:
    return Config(values, user_keys=user_keys, defaults=defaults)


def load_schema(path: str = DEFAULT_CONFIG) -> tuple[dict[str, ConfigValue], dict[str, str],
                                                      dict[str, list]]:
    """Read the schema file: (defaults, help texts, choices).

    Raises:
        ConfigError: If the file does not hold the three documents, a key lacks help, or a
            null default has no type (``NULL_DEFAULT_TYPES``).
    """
    docs = _read_yaml_documents(path)
    if len(docs) != 3:
        raise ConfigError(f"{path}: expected 3 YAML documents (values, help, choices), "
                          f"found {len(docs)}")
    defaults, helps, choices = docs
    missing = [key for key in defaults if key not in helps]
    if missing:
        raise ConfigError(f"{path}: no help text for keys {missing}")
    untyped = [k for k, v in defaults.items() if v is None and k not in NULL_DEFAULT_TYPES]
    if untyped:
        raise ConfigError(f"{path}: keys {untyped} default to null without a type in "
                          f"NULL_DEFAULT_TYPES (src/utils/config.py)")
    return defaults, helps, choices


class _DuplicateKey(ValueError):
    """A mapping of a YAML file gives a key twice: (key, first line, second line)."""


INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
YAML12_INT = re.compile(r"^[-+]?[0-9]+$")
YAML12_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
"""YAML 1.2 core-schema numbers (decimal only; ``0x``/``0o`` forms stay text, as on the command
line). See docs/configuration.md#setting-values."""


def _without_number_resolvers(resolvers):
    return {first: [(tag, regexp) for tag, regexp in pairs if tag not in (INT_TAG, FLOAT_TAG)]
            for first, pairs in resolvers.items()}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading numbers as YAML 1.2 does (``010`` is 10, ``1:20`` is text:
    no octal or base 60) and refusing a key given twice in a mapping (merge keys excepted)."""

    yaml_implicit_resolvers = _without_number_resolvers(yaml.SafeLoader.yaml_implicit_resolvers)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
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

    def construct_decimal_int(self, node: yaml.ScalarNode) -> int:
        """An ``!!int`` scalar read in base 10, as ``int()`` reads a flag."""
        text = self.construct_scalar(node)
        if not YAML12_INT.match(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not a decimal integer", node.start_mark)
        return int(text, 10)


class _ConfigDumper(yaml.SafeDumper):
    """PyYAML's safe dumper quoting every string either YAML 1.1 or 1.2 reads as a number."""


for _cls in (_UniqueKeyLoader, _ConfigDumper):
    _cls.add_implicit_resolver(INT_TAG, YAML12_INT, list("-+0123456789"))
    _cls.add_implicit_resolver(FLOAT_TAG, YAML12_FLOAT, list("-+0123456789."))
_UniqueKeyLoader.add_constructor(INT_TAG, _UniqueKeyLoader.construct_decimal_int)


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


def read_recipe(path: str) -> dict[str, object]:
    """The ``key: value`` mapping of a recipe file (a copy of config.yaml gives its first
    document), without ``RECIPE_IGNORED`` keys.

    Raises:
        ConfigError: For several documents (not a config.yaml copy), a key given twice,
            invalid YAML or non-UTF-8 text.
    """
    starts = []
    docs = _read_yaml_documents(path, starts) or [{}]
    if len(docs) > 1 and not _is_schema_copy(docs):
        raise ConfigError(f"{path} holds {len(docs)} YAML documents (the second starts at line "
                          f"{starts[1]}): a recipe is one document of key: value lines, only the "
                          f"first would be read; merge them into one")
    return {k: v for k, v in docs[0].items() if k not in RECIPE_IGNORED}


def _is_schema_copy(docs):
    """Whether ``docs`` have config.yaml's layout: values, help texts, choices."""
    return (len(docs) == 3 and all(isinstance(v, str) for v in docs[1].values())
            and all(isinstance(v, list) for v in docs[2].values()))


def typed_default(key: str, default: ConfigValue) -> ConfigValue:
    """``default``, or for a null one a value of the key's type (``NULL_DEFAULT_TYPES``): what
    the key's type is read from."""
    return NULL_DEFAULT_TYPES[key]() if default is None else default


def coerce(key: str, value: object, default: ConfigValue, source: str) -> ConfigValue:
    """``value`` as the type of ``default``: strings (flags, YAML's ``1e-4``) are parsed, an int
    is accepted for a float key; a key whose default is null takes null (``NULL_WORDS``) too;
    ``source`` (file or "command line") is named in errors.

    Raises:
        ConfigError: If the value cannot be read as the key's type.
    """
    nullable = default is None
    if nullable and (value is None or (isinstance(value, str)
                                       and value.strip().lower() in NULL_WORDS)):
        return None
    default = typed_default(key, default)
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
    except (TypeError, ValueError, yaml.YAMLError):
        raise ConfigError(f"{source}: key {key!r} expects {_type_name(default)}"
                          f"{' or null' if nullable else ''}, got {value!r}") from None
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
        return yaml.load(text if text.strip().startswith("[") else f"[{text}]",
                         Loader=_UniqueKeyLoader)
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


def merge(values: dict[str, ConfigValue], updates: dict[str, object],
          defaults: dict[str, ConfigValue], choices: dict[str, list], source: str) -> None:
    """Apply ``updates`` to ``values`` (the dict a ``Config`` is made of) in place, checking
    key names, types and choices.

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
        values[key] = value


def read_sections(path: str = DEFAULT_CONFIG) -> dict[str, list[str]]:
    """Section name -> keys, in file order, of the schema's ``# ---- name ----`` comments."""
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


def build_parser(defaults: dict[str, ConfigValue], helps: dict[str, str], description: str,
                 sections: dict[str, list[str]] | None = None,
                 shown: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """A parser with one ``--key`` flag per config key (read as text); ``--help`` lists the
    keys of the ``shown`` sections (None: all), grouped, and accepts the others unlisted."""
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
            shown_default = "null" if defaults[key] is None else repr(defaults[key])
            group.add_argument(f"--{key}", default=argparse.SUPPRESS,
                               metavar=_metavar(typed_default(key, defaults[key])),
                               help=f"{helps[key]} (default: {shown_default})" if listed
                               else argparse.SUPPRESS)
    return parser


def _metavar(default):
    return type(default).__name__.upper() if not isinstance(default, list) else "LIST"


def check_values(cfg: Config) -> None:
    """Range checks shared by every entry point: floats finite, ``check_upper_bounds``, then
    ``POSITIVE``, ``NON_NEGATIVE``, ``UNIT_INTERVAL`` (of the keys set: not null), ``INT_RANGES``
    and the rest.

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
        if cfg[key] is not None and cfg[key] <= 0:
            kind = "a positive integer" if isinstance(cfg[key], int) else "positive"
            raise ConfigError(f"{key} must be {kind}, got {cfg[key]}")
    for key in NON_NEGATIVE:
        if cfg[key] is not None and cfg[key] < 0:
            raise ConfigError(f"{key} must be 0 or positive, got {cfg[key]}")
    for key, interval in UNIT_INTERVAL.items():
        if cfg[key] is None:
            continue
        if (not 0 <= cfg[key] <= 1 or (interval.endswith(")") and cfg[key] == 1)
                or (interval.startswith("(") and cfg[key] == 0)):
            raise ConfigError(f"{key} must be in {interval}, got {cfg[key]}")
    if cfg.scale_factor <= 1:
        raise ConfigError(f"scale_factor must be > 1, got {cfg.scale_factor}")
    for key, (low, high, note) in INT_RANGES.items():
        if not low <= cfg[key] <= high:
            raise ConfigError(f"{key} must be in {low}..{high}{note}, got {cfg[key]}")
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


def check_upper_bounds(cfg: Config) -> None:
    """``UPPER_BOUNDS``, ``INT32_MAX`` for other ints (list items too), ``FLOAT32_MAX`` for floats.

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


def parse_config(argv: list[str] | None = None, description: str = "ResNet on MindSpore",
                 schema_path: str = DEFAULT_CONFIG,
                 sections: tuple[str, ...] | None = None) -> Config:
    """Resolve an entry point's configuration: every key of config.yaml, type- and
    range-checked, plus ``config_path``; ``sections``: those ``--help`` lists (None: all).

    Raises:
        ConfigError: For an unknown key, a wrong type, a value outside its choices or range.
    """
    defaults, helps, choices = load_schema(schema_path)
    parser = build_parser(defaults, helps, description, read_sections(schema_path), sections)
    args = parser.parse_args(argv)
    flags = vars(args)
    config_path = flags.pop("config_path")
    values = dict(defaults)
    recipe = {}
    if os.path.abspath(config_path) != os.path.abspath(schema_path):
        recipe = read_recipe(config_path)
        merge(values, recipe, defaults, choices, config_path)
    merge(values, flags, defaults, choices, "command line")
    cfg = Config(values, config_path=config_path, defaults=copy.deepcopy(defaults),
                 user_keys=frozenset(recipe) | frozenset(flags))
    check_values(cfg)
    return cfg

"""Configuration: ``config.yaml`` defaults, an optional recipe file, then ``--key value`` flags.

``config.yaml`` (at the repository root) is both the default recipe and the schema: its first
YAML document gives every key with its default value (whose type is the key's type), the
second the meaning and unit of each key (printed by ``--help``), the third the allowed values
of keys with a closed set. Same layout as ModelZoo's ``*_config.yaml`` files.

Override order, later wins: ``config.yaml`` < ``--config_path FILE`` < command-line flags.
"""
import argparse
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "config.yaml")
TRUE_WORDS = {"true", "yes", "1", "on"}
FALSE_WORDS = {"false", "no", "0", "off"}


class ConfigError(ValueError):
    """A config file or flag is malformed, names an unknown key, or has a wrong value."""


class Config(dict):
    """A resolved configuration: a dict whose keys are also attributes (``cfg.batch_size``)."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}") from None

    def to_yaml(self):
        """Return the config as YAML text, keys in schema order."""
        return yaml.safe_dump(dict(self), sort_keys=False, default_flow_style=None)


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


def _read_yaml_documents(path):
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        try:
            docs = [doc if doc is not None else {} for doc in yaml.safe_load_all(f)]
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
    for doc in docs:
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: expected a mapping of key: value, got {type(doc).__name__}")
    return docs


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
        if key not in defaults:
            raise ConfigError(f"{source}: unknown config key {key!r}; "
                              f"valid keys: {', '.join(defaults)}")
        value = coerce(key, value, defaults[key], source)
        if key in choices and value not in choices[key]:
            raise ConfigError(f"{source}: key {key!r} must be one of {choices[key]}, "
                              f"got {value!r}")
        cfg[key] = value


def build_parser(defaults, helps, description):
    """An ``argparse`` parser with one ``--key`` flag per config key (value read as text)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Values are checked against the types of config.yaml. Lists: --key 85,160.")
    parser.add_argument("--config_path", default=DEFAULT_CONFIG,
                        help="YAML recipe whose keys override config.yaml (e.g. configs/*.yaml)")
    for key, default in defaults.items():
        parser.add_argument(f"--{key}", default=argparse.SUPPRESS, metavar=_metavar(default),
                            help=f"{helps[key]} (default: {default!r})")
    return parser


def _metavar(default):
    return type(default).__name__.upper() if not isinstance(default, list) else "LIST"


def parse_config(argv=None, description="ResNet on MindSpore", schema_path=DEFAULT_CONFIG):
    """Resolve the configuration of an entry point.

    Args:
        argv (list[str], optional): Command-line arguments (default: ``sys.argv[1:]``).
        description (str): Shown by ``--help``.
        schema_path (str): The schema/defaults file (``config.yaml``).

    Returns:
        Config: every key of config.yaml with its resolved, type-checked value, plus
        ``config_path``.

    Raises:
        ConfigError: For an unknown key, a value of the wrong type or outside its choices,
            in the recipe file or on the command line. (``--help`` and flag syntax errors
            exit through argparse.)
    """
    defaults, helps, choices = load_schema(schema_path)
    args = build_parser(defaults, helps, description).parse_args(argv)
    flags = vars(args)
    config_path = flags.pop("config_path")
    cfg = Config(defaults)
    if os.path.abspath(config_path) != os.path.abspath(schema_path):
        recipe = _read_yaml_documents(config_path)
        merge(cfg, recipe[0] if recipe else {}, defaults, choices, config_path)
    merge(cfg, flags, defaults, choices, "command line")
    cfg["config_path"] = config_path
    return cfg

"""Generate docs/configuration.md, the configuration reference, from config.yaml.

    python tools/gen_config_docs.py           # rewrite docs/configuration.md
    python tools/gen_config_docs.py --check   # exit 1 if the page is out of date (for CI)

``config.yaml`` is the one source of the configuration (see the page's "Adding a key"). The page
is read through the functions the entry points use (``load_schema``, ``read_sections``), its
ranges from the names ``check_values`` checks (``src/utils/limits.py``); ``tests/test_config.py``
checks that the committed page is what it writes.
"""
import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from src.utils.cli import run_entry_point  # noqa: E402
from src.utils.config import (  # noqa: E402
    DEFAULT_CONFIG,
    INT_RANGES,
    NON_NEGATIVE,
    POSITIVE,
    UNIT_INTERVAL,
    UPPER_BOUNDS,
    ConfigValue,
    load_schema,
    read_sections,
    typed_default,
)
from src.utils.files import plain_file_mode  # noqa: E402
from src.utils.limits import (  # noqa: E402
    FLOAT32_MAX,
    INT32_MAX,
    RANDAUGMENT_MAX_MAGNITUDE,
    RANDAUGMENT_MAX_OPS,
)

PAGE = os.path.join(ROOT, "docs", "configuration.md")
CODE_RANGES = {"scale_factor": "> 1", "randaugment_num_ops": f"from 0 to {RANDAUGMENT_MAX_OPS}",
               "randaugment_magnitude": f"from 0 to {RANDAUGMENT_MAX_MAGNITUDE}",
               "train_crop_scale": "[min, max] with 0 < min <= max <= 1"}
"""Ranges that ``check_values`` checks in its code rather than through its key tuples
(``POSITIVE``, ``NON_NEGATIVE``, ``UNIT_INTERVAL``); they take precedence over the tuples."""
TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string"}
LIST_TYPE_NAMES = {int: "list of integers", float: "list of numbers", str: "list of strings"}

INTRO = """\
# Configuration

This page is the reference of every configuration key: its default, meaning and accepted values.
It is generated from [`config.yaml`](../config.yaml) by `python tools/gen_config_docs.py`; do not
edit it by hand."""

FLOAT32_TXT = f"{FLOAT32_MAX:.2g}".replace("e+", "e")  # 3.4e38

USAGE = f"""\
## Setting values

The defaults, in [`config.yaml`](../config.yaml), are the ResNet-50 v1.5 ImageNet recipe of
NVIDIA's DeepLearningExamples (PyTorch). Every key of `config.yaml` can be set in a recipe file
(`--config_path configs/x.yaml`; the recipes of this project are in [`configs/`](../configs/)) or
on the command line (`--key value`); later wins: `config.yaml` < `--config_path` file < flags.
Lists are given as `--all_reduce_fusion_config 85,160`.

`--help` lists, for each entry point (`train.py`, `eval.py`, `export.py`, `predict.py`,
`serve.py`), the keys it reads, grouped by the sections below, with meaning and default; the
other keys are accepted (recipe files and launch scripts pass them to every entry point) and
ignored.

An unknown key, a value of the wrong type or out of range (checked in one place, `check_values` in
[`src/utils/config.py`](../src/utils/config.py)), in a file or on the command line, stops with an
error that names it (`1e-4` in YAML is accepted for a float key). Numbers in YAML files are read
as on the command line, as YAML 1.2 reads them: `010` is 10 (not YAML 1.1's octal 8); `1:20`
(1.1's base 60) and `0x10` are refused for an integer key. Every integer is at most
{INT32_MAX} and every number at most {FLOAT32_TXT} in magnitude (MindSpore's int32 and float32); the
"accepts" column gives the keys bounded lower.

A recipe file is one YAML document, each key once: a second document (`---`) or a key given
twice is an error naming it. A copy of `config.yaml` is accepted (its second and third
documents, the help texts and choices, are not read), and so is a run's written
`output_dir/config.yaml`, whose `config_path` key is ignored.

## Adding a key

A new key goes into `config.yaml` only: its default in the first YAML document, under the
`# ---- section ----` comment of its section (the default's type is the key's type; a null
default, a value left to the code, takes its type from `NULL_DEFAULT_TYPES` in
[`src/utils/config.py`](../src/utils/config.py)), its meaning in the second document, its
allowed values in the third if it has a closed set. Range checks go in
`check_values`, their limits in [`src/utils/limits.py`](../src/utils/limits.py). Then regenerate
this page with `python tools/gen_config_docs.py`; a test fails while the page is out of date
(`python tools/gen_config_docs.py --check` tells the same)."""

KEYS_INTRO = """\
## Keys

The "accepts" column gives the key's type (the type of its default) and, where the config loader
checks them, its allowed values or range. A key whose default is `null` is unset: the code
chooses its value (the optimizer hyperparameters: the chosen optimizer's own default, declared
in `OPTIMIZERS` of [`src/training/optimizer.py`](../src/training/optimizer.py)); `null` in a
file or `--key null` unsets it again."""


def format_default(value: ConfigValue) -> str:
    """A default as written in YAML: ``true``, ``""``, ``[0.08, 1.0]``.

    Args:
        value: A default value of config.yaml.

    Returns:
        str: The value's text, without Markdown quoting.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(format_default(item) for item in value) + "]"
    if value == "":
        return '""'
    return str(value)


def accepted_values(key: str, default: ConfigValue, choices: dict[str, list]) -> str:
    """What a key accepts: its type, then its allowed values or range when one is checked.

    Args:
        key: Config key.
        default: Its default value, whose type is the key's type.
        choices: Key -> allowed values (config.yaml's third document).

    Returns:
        str: E.g. ``integer > 0``, ``number in [0, 1)``, ``one of `GRAPH`, `PYNATIVE```;
        ``..., or null`` for a key whose default is null.
    """
    if default is None:
        return accepted_values(key, typed_default(key, default), choices) + ", or null"
    if key in choices:
        return "one of " + ", ".join(f"`{value}`" for value in choices[key])
    if isinstance(default, list):
        kind = LIST_TYPE_NAMES[type(default[0]) if default else int]
    else:
        kind = TYPE_NAMES[type(default)]
    if key == "seed":
        return f"{kind} from 0 to {UPPER_BOUNDS[key][0]}"
    bound = f", at most {UPPER_BOUNDS[key][0]}" if key in UPPER_BOUNDS else ""
    if key in INT_RANGES:
        return f"{kind} from {INT_RANGES[key][0]} to {INT_RANGES[key][1]}{bound}"
    if key in CODE_RANGES:
        return f"{kind} {CODE_RANGES[key]}{bound}"
    if key in UNIT_INTERVAL:
        return f"{kind} in {UNIT_INTERVAL[key]}{bound}"
    if key in POSITIVE:
        return f"{kind} > 0{bound}"
    if key in NON_NEGATIVE:
        return f"{kind} >= 0{bound}"
    return kind + (f" at most {UPPER_BOUNDS[key][0]}" if bound else "")


def markdown_text(text: str) -> str:
    """Escape the characters of plain text that Markdown would read as markup in a table cell:
    ``<`` (HTML tags such as ``<time>``), ``|`` (cell separator), ``*`` (emphasis)."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|")
            .replace("*", "\\*"))


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def section_table(title: str, keys: list[str], defaults: dict[str, ConfigValue],
                  helps: dict[str, str], choices: dict[str, list]) -> str:
    """One section of the page: its heading and a table of its keys.

    Args:
        title: Section heading.
        keys: The section's keys, in config.yaml order.
        defaults, helps, choices: config.yaml's three documents (``load_schema``).

    Returns:
        str: Markdown of the section.
    """
    lines = [f"### {title}", "", "| key | default | meaning | accepts |", "|---|---|---|---|"]
    for key in keys:
        default = defaults[key]
        lines.append(f"| `{key}` | `{format_default(default)}` | {markdown_text(helps[key])} | "
                     f"{accepted_values(key, default, choices)} |")
    return "\n".join(lines)


def render(schema_path: str = DEFAULT_CONFIG) -> str:
    """The text of the configuration page for a schema file.

    Args:
        schema_path: The schema/defaults file (config.yaml).

    Returns:
        str: The whole Markdown page.

    Raises:
        ConfigError: If the schema file is malformed or a key has no meaning.
    """
    defaults, helps, choices = load_schema(schema_path)
    sections = {name: [key for key in keys if key in defaults]
                for name, keys in read_sections(schema_path).items()}
    grouped = {key for keys in sections.values() for key in keys}
    other = [key for key in defaults if key not in grouped]
    if other:
        sections["other"] = other
    contents = "Sections: " + " · ".join(f"[{title}](#{anchor(title)})" for title in sections)
    tables = [section_table(title, keys, defaults, helps, choices)
              for title, keys in sections.items()]
    return "\n\n".join([INTRO, USAGE, KEYS_INTRO, contents, *tables]) + "\n"


def read_page(path: str) -> str | None:
    """The text of an existing page, or None if there is none."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``,
    so that a reader never sees a half-written page; with the mode of a plain write."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".configuration-", suffix=".md.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            plain_file_mode(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def display_path(path: str) -> str:
    """A path for messages: relative to the repository root when inside it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options: ``--check``, ``--config``, ``--output``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the page differs from what would be written")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="schema/defaults file (default: config.yaml)")
    parser.add_argument("--output", default=PAGE,
                        help="page to write or check (default: docs/configuration.md)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` compare it with the committed one.

    Returns:
        int: 0 when written or up to date, 1 when ``--check`` finds the page out of date.
    """
    args = parse_args(argv)
    page = render(args.config)
    shown = display_path(args.output)
    if args.check:
        if read_page(args.output) != page:
            print(f"{shown} is out of date with {display_path(args.config)}: "
                  "run python tools/gen_config_docs.py", file=sys.stderr)
            return 1
        print(f"{shown} is up to date")
        return 0
    write_atomically(args.output, page)
    print(f"wrote {shown} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    run_entry_point(main)

"""The README and docs/: links that resolve, a README of one screen, commands that name real keys
and files, and the benchmark tables' markers where the benchmarks write them."""
import glob
import os
import re

import pytest

from src.utils.config import load_schema
from tests.helpers import ROOT

README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
README_MAX_LINES = 200
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
# [text](target) and ![alt](target); the text may wrap over lines
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ENTRY_POINTS = ("train.py", "eval.py", "export.py", "predict.py", "serve.py", "label_issues.py")
REPO_PATH = re.compile(r"(?<![\w./-])((?:scripts|configs|tools|benchmarks)/[\w./-]*\w)")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, ROOT)


def prose_lines(text):
    """The lines of ``text``, those of fenced code blocks (fences included) blanked."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            yield ""
        else:
            yield "" if inside else line


def code_blocks(text):
    """The lines of each fenced code block of ``text``, one list per block."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation dropped except hyphens (and
    underscores), spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """The anchors of a Markdown file's headings, numbered as GitHub numbers repeats."""
    seen, result = {}, set()
    for line in prose_lines(read(path)):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path):
    """(target, line number) of every link outside code in ``path``."""
    text = "\n".join(prose_lines(read(path)))
    # code spans (which may wrap) emptied, their line breaks kept: `[a](b)` is no link, and
    # [`config.yaml`](../config.yaml) still is
    text = INLINE_CODE.sub(lambda m: "``" + "\n" * m.group().count("\n"), text)
    for match in LINK.finditer(text):
        yield match.group(1), text.count("\n", 0, match.start()) + 1


def broken_links(path):
    """The links of ``path`` whose file, folder or heading does not exist."""
    broken = []
    for target, line in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                    if file_part else path)
        where = f"{rel(path)}:{line}: {target}"
        if not os.path.exists(resolved):
            broken.append(f"{where} (no {rel(resolved)})")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{where} (no heading #{anchor} in {rel(resolved)})")
    return broken


def test_slug_follows_github():
    assert slug("Evaluation, export, prediction") == "evaluation-export-prediction"
    assert slug("Distributed training (data parallel)") == "distributed-training-data-parallel"
    assert slug("int8 quantization") == "int8-quantization"
    assert slug("Fine-tune on a folder of images") == "fine-tune-on-a-folder-of-images"
    assert slug("`--update_docs` and `sink_size`") == "--update_docs-and-sink_size"


def test_link_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## Real heading\n")
    page.write_text("# Page\n\n[ok](other.md#real-heading) [ok](#page) [web](https://x.org/y)\n"
                    "[gone](missing.md) [bad anchor](other.md#nothing)\n\n"
                    "```bash\n[not a link](nowhere.md)\n```\n")
    broken = broken_links(str(page))
    assert len(broken) == 2
    assert "missing.md" in broken[0] and "#nothing" in broken[1]


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_readme_fits_on_one_screen_per_job():
    lines = read(README).splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_starts_with_the_fresh_machine_commands():
    head = "\n".join(read(README).splitlines()[:20])
    assert "bash scripts/run_quick_start.sh" in head and "bash scripts/run_tests.sh" in head


def test_readme_answers_the_newcomer_questions_in_one_click():
    """How to start, fine-tune on a folder, launch 8 devices, where the speed figures come
    from: each a heading of the README that links the page with the details."""
    text = read(README)
    sections = re.split(r"^## ", text, flags=re.M)

    def section(title):
        found = [s for s in sections if s.startswith(title)]
        assert found, f"README.md has no section '## {title}'"
        return found[0]

    assert "run_quick_start.sh" in text.split("\n## ")[0]
    assert "--pre_trained" in section("Fine-tune on a folder") and "docs/training.md" in \
        section("Fine-tune on a folder")
    assert "8 devices" in section("Distributed") and "docs/distributed.md" in section("Distributed")
    assert "scripts/run_benchmark.sh" in section("Measure speed") and "docs/speed.md" in \
        section("Measure speed")


@pytest.mark.parametrize("path", [p for p in PAGES if p != README], ids=rel)
def test_every_docs_page_starts_with_what_it_is_for(path):
    lines = [line for line in read(path).splitlines() if line.strip()]
    assert lines[0].startswith("# "), f"{rel(path)} starts with {lines[0]!r}, not a title"
    first = lines[1]
    assert not re.match(r"^(#|```|\||- |\* |!\[)", first), (
        f"{rel(path)}: the title is followed by {first!r}, not a sentence saying what the page "
        "is for")


def commands(path):
    """Each shell command of the bash blocks of ``path``, continuation lines joined, comments
    dropped."""
    for block in code_blocks(read(path)):
        joined = ""
        for line in block:
            line = re.sub(r"(^|\s)#.*$", "", line).rstrip()
            if line.endswith("\\"):
                joined += line[:-1] + " "
                continue
            joined += line
            if joined.strip():
                yield joined.strip()
            joined = ""


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_documented_commands_use_real_keys_and_files(path):
    """The entry-point commands name only config keys, and the scripts, configs, tools and
    benchmarks the pages name exist."""
    defaults, _, _ = load_schema()
    keys = set(defaults) | {"config_path", "help"}
    problems = []
    for command in commands(path):
        words = command.split()
        if len(words) > 1 and words[0] == "python" and words[1] in ENTRY_POINTS:
            problems += [f"{words[1]}: unknown flag --{flag}"
                         for flag in re.findall(r"(?:^|\s)--(\w+)", command) if flag not in keys]
        problems += [f"no file {p}" for p in REPO_PATH.findall(command)
                     if not glob.glob(os.path.join(ROOT, p.replace("{", "*").replace("}", "*")))
                     and not os.path.exists(os.path.join(ROOT, p))]
    assert problems == [], f"{rel(path)}: {problems}"


@pytest.mark.parametrize("module_name, page, start, end", [
    ("cpu_benchmark", "speed.md", "<!-- cpu-benchmark:start -->", "<!-- cpu-benchmark:end -->"),
    ("accuracy_parity", "parity.md", "<!-- parity:start -->", "<!-- parity:end -->"),
])
def test_benchmarks_update_the_page_holding_their_table(module_name, page, start, end):
    """``--update_docs`` of each benchmark rewrites the marked block of its docs page, which
    holds the markers exactly once."""
    import importlib
    module = importlib.import_module(f"benchmarks.{module_name}")
    assert (module.TABLE_START, module.TABLE_END) == (start, end)
    target = module.update_docs.__defaults__[0]
    assert target == os.path.join(ROOT, "docs", page)
    text = read(target)
    assert text.count(start) == 1 and text.count(end) == 1
    assert text.index(start) < text.index(end)
    assert start not in read(README)


def test_parity_update_docs_replaces_only_the_marked_block(tmp_path):
    from benchmarks.accuracy_parity import TABLE_END, TABLE_START, ParityError, update_docs
    page = tmp_path / "parity.md"
    page.write_text(f"intro\n{TABLE_START}\nold\n{TABLE_END}\nend\n")
    update_docs("| new |", str(page))
    assert page.read_text() == f"intro\n{TABLE_START}\n| new |\n{TABLE_END}\nend\n"
    page.write_text("no markers\n")
    with pytest.raises(ParityError, match="parity.md lacks the markers"):
        update_docs("x", str(page))

"""House rules of src/ that keep it cheap to change (docs/layout.md, "House rules"): docstrings say
what in a few lines, wide signatures are keyword-only, public signatures carry type hints, and
docs/layout.md names every module."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_DOC_RATIO = 0.4  # docstring lines per code line over src/
MAX_PROSE_LINES = 20  # a docstring's text before its Args/Returns/Raises/... sections
MAX_POSITIONAL = 5  # parameters after self that may be passed by position
SECTIONS = ("Args:", "Returns:", "Raises:", "Yields:", "Inputs:", "Outputs:", "Attributes:",
            "Example:", "Examples:")


def src_files():
    for folder, _, files in os.walk(os.path.join(ROOT, "src")):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def docstring_nodes(tree):
    """(owner node, docstring expression) pairs, attribute docstrings included (owner None)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for i, stmt in enumerate(body if isinstance(body, list) else []):
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                yield (node if i == 0 and isinstance(node, owners) else None), stmt


def measure(source):
    """(docstring lines, code lines, [(prose lines, name)]) of one module's source."""
    tree = ast.parse(source)
    doc_lines, prose = set(), []
    for owner, stmt in docstring_nodes(tree):
        doc_lines.update(range(stmt.lineno, stmt.end_lineno + 1))
        text = []
        for line in stmt.value.value.splitlines():
            if line.strip() in SECTIONS:
                break
            text.append(line)
        name = getattr(owner, "name", "<module>") if owner else "<attribute>"
        prose.append((len(text), name))
    code = sum(1 for number, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and number not in doc_lines)
    return len(doc_lines), code, prose


def test_measure_counts_docstrings_code_and_prose():
    source = ('def f(x):\n    """One.\n\n    Two.\n\n    Args:\n        x: y.\n    """\n'
              '    return x\n')
    assert measure(source) == (7, 2, [(4, "f")])


def test_docstrings_say_what_in_a_few_lines():
    total_doc = total_code = 0
    long_prose = []
    for path in src_files():
        doc, code, prose = measure(open(path, encoding="utf-8").read())
        total_doc, total_code = total_doc + doc, total_code + code
        rel = os.path.relpath(path, ROOT)
        long_prose += [f"{rel}:{name} ({n} lines)" for n, name in prose if n > MAX_PROSE_LINES]
    assert total_doc / total_code <= MAX_DOC_RATIO, (
        f"{total_doc} docstring lines for {total_code} code lines in src/: move design notes and "
        "measurements to the docs page of their topic")
    assert not long_prose, f"docstring prose over {MAX_PROSE_LINES} lines: {long_prose}"


def public_functions(tree):
    """Functions and methods whose name has no leading underscore, with their class (or None);
    ``construct`` (a Cell's graph inputs, positional by MindSpore's rules) excluded."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.startswith("_"):
            continue
        holder = node if isinstance(node, ast.ClassDef) else None
        body = getattr(node, "body", None)
        for item in body if isinstance(body, list) else []:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                public = not item.name.startswith("_") or item.name == "__init__"
                if public and item.name != "construct":
                    yield holder, item


def positional_params(function, method):
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    return names[1:] if method and names and names[0] in ("self", "cls") else names


def wide_positional(source):
    tree = ast.parse(source)
    return [f"{(holder.name + '.') if holder else ''}{fn.name}"
            for holder, fn in public_functions(tree)
            if len(positional_params(fn, holder is not None)) > MAX_POSITIONAL]


def test_wide_positional_finds_a_six_parameter_function():
    assert wide_positional("def f(a, b, c, d, e, g):\n    pass\n") == ["f"]
    assert wide_positional("def f(a, b, c, d, e, *, g):\n    pass\n") == []


def test_wide_signatures_are_keyword_only():
    found = []
    for path in src_files():
        rel = os.path.relpath(path, ROOT)
        found += [f"{rel}:{name}" for name in wide_positional(open(path, encoding="utf-8").read())]
    assert not found, (f"more than {MAX_POSITIONAL} positional parameters (make the rest "
                       f"keyword-only): {found}")


def layout_modules():
    return [os.path.relpath(p, ROOT) for p in src_files() if not p.endswith("__init__.py")]


@pytest.mark.parametrize("module", layout_modules())
def test_layout_page_names_every_module(module):
    page = open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8").read()
    assert module in page, f"docs/layout.md misses {module}"


# ---- the task is an object: nothing compares task names ----

ENTRY_POINTS = ("train.py", "eval.py", "export.py", "predict.py", "serve.py", "label_issues.py")


def task_name_comparisons(source, names):
    """(line, text) of each comparison (``==``, ``!=``, ``in``, ``not in``) against a string
    literal of ``names`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = [n for operand in operands for n in ast.walk(operand)
                    if isinstance(n, ast.Constant) and n.value in names]
        if literals:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_finder_sees_a_task_name_comparison():
    assert task_name_comparisons('if cfg.task == "multilabel": pass', {"multilabel"}) == [
        (1, "cfg.task == 'multilabel'")]
    assert task_name_comparisons('x = cfg.task in ("multiclass",)', {"multiclass"}) != []
    assert task_name_comparisons('x = get_task(cfg.task).multi_hot', {"multilabel"}) == []


def test_no_task_name_is_compared_outside_the_task_registry():
    """docs/layout.md#the-task-and-the-model-record: code asks the ``Task`` object."""
    from src.utils.tasks import TASKS

    registry = os.path.join(ROOT, "src", "utils", "tasks.py")
    files = [f for f in src_files() if f != registry] + [
        os.path.join(ROOT, name) for name in ENTRY_POINTS]
    found = {os.path.relpath(path, ROOT): hits for path in files
             if (hits := task_name_comparisons(open(path, encoding="utf-8").read(),
                                               set(TASKS)))}
    assert not found, found

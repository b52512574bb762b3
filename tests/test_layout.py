"""The package layout: ``src.env`` loads alone, imports go one way between the packages of
``src/`` (entry points -> recipe -> training / deploy -> data / models -> utils), no import
cycles, each package exports its ``create_*`` entry points, and only ``src/recipe/`` (and the
config module) below the entry points takes the config object."""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Layer of each package of src/: a module may import its own package and lower layers only.
# ``recipe`` (src/recipe/, the config's adapters) is the top floor: nothing in src/ imports it.
LAYERS = {"env": 0, "startup": 0, "utils": 0, "data": 1, "models": 1, "training": 2, "deploy": 2,
          "recipe": 3}
# Who may import src.recipe besides src/: the entry points, the benchmarks and the tests.
RECIPE_USERS = ("train.py", "eval.py", "export.py", "predict.py", "serve.py", "label_issues.py",
                "benchmarks",
                "tests")


def src_modules():
    """{dotted module name: path} of every module under src/."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "src")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def src_imports(path):
    """The ``src.*`` modules a file imports (module level and inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("src."):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("src."))
    return names


def package_of(module):
    return module.split(".")[1]


def layering_violations(modules):
    """``importer -> imported`` pairs that go up a layer or sideways to another package."""
    bad = []
    for module, path in modules.items():
        if module == "src":
            continue
        own = package_of(module)
        for target in src_imports(path):
            other = package_of(target)
            if other != own and LAYERS[other] >= LAYERS[own]:
                bad.append(f"{module} -> {target}")
    return bad


def import_cycles(modules):
    """Cycles in the module-level ``src`` import graph, each as a list of modules."""
    graph = {m: {t for t in src_imports(p) if t in modules} for m, p in modules.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_every_package_has_a_layer_and_imports_go_one_way():
    modules = src_modules()
    assert {package_of(m) for m in modules if m != "src"} == set(LAYERS)
    assert layering_violations(modules) == []


def test_a_module_importing_up_a_layer_is_found(tmp_path):
    # The check itself: a data module that imports training is a violation.
    fake = tmp_path / "bad.py"
    fake.write_text("from src.training.loss import create_loss\n")
    assert layering_violations({"src.data.bad": str(fake)}) == [
        "src.data.bad -> src.training.loss"]


def test_a_module_importing_the_recipe_is_found(tmp_path):
    fake = tmp_path / "bad.py"
    fake.write_text("def f():\n    from src.recipe import build_data\n")
    assert layering_violations({"src.training.bad": str(fake)}) == [
        "src.training.bad -> src.recipe"]


def recipe_importers_outside(users=RECIPE_USERS):
    """Python files of the repository outside src/ and ``users`` that import src.recipe (or one
    of its modules)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("src", "__pycache__")]
        for name in files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, ROOT)
            if (name.endswith(".py") and relative.split(os.sep)[0] not in users
                    and any(package_of(m) == "recipe" for m in src_imports(path))):
                found.append(relative)
    return found


def test_only_entry_points_benchmarks_and_tests_import_the_recipe():
    assert recipe_importers_outside() == []
    assert os.path.join("tests", "test_sink_mode.py") in recipe_importers_outside(())  # found


def config_takers(modules):
    """``module.function`` of the functions in ``modules`` with a parameter named ``cfg``."""
    found = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if "cfg" in names:
                    found.append(f"{module}.{node.name}")
    return found


def test_only_the_recipe_takes_the_config():
    """Below the entry points, src/recipe/ (and the config module, which makes it) is the
    one door of the config object: the library takes plain arguments."""
    modules = src_modules()
    recipe = {m: p for m, p in modules.items() if m.split(".")[:2] == ["src", "recipe"]}
    others = {m: p for m, p in modules.items() if m not in recipe and m != "src.utils.config"}
    assert config_takers(others) == []
    assert "src.recipe.data.build_data" in config_takers(recipe)


def test_no_import_cycles():
    assert import_cycles(src_modules()) == []


def test_a_cycle_is_found(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from src.utils.b import x\n")
    b.write_text("import src.utils.a\n")
    assert import_cycles({"src.utils.a": str(a), "src.utils.b": str(b)}) == [
        ["src.utils.a", "src.utils.b", "src.utils.a"]]


def test_src_env_loads_no_mindspore_and_sets_the_onednn_cap():
    code = ("import os, sys; os.environ.pop('ONEDNN_MAX_CPU_ISA', None); import src.env; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mindspore', 'numpy', 'src.utils'))); print(os.environ['ONEDNN_MAX_CPU_ISA'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "AVX2"


def test_a_core_module_loads_without_mindspore_the_door_on_first_use():
    """``src.utils``'s door loads a name's module when the name is first used: importing the
    config, CLI, files or curves modules (tools/gen_config_docs.py, tools/plot_metrics.py)
    loads no MindSpore; taking a name of the checkpoint module through the door does."""
    code = ("import sys; import src.utils.config, src.utils.cli, src.utils.files, "
            "src.utils.curves; print('mindspore' in sys.modules); "
            "from src.utils import parse_config, read_checkpoint; "
            "print('mindspore' in sys.modules, read_checkpoint.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["False", "True src.utils.checkpoint"]


@pytest.mark.parametrize("package, entry_points", [
    ("src.data", ["create_dataset", "create_transforms"]),
    ("src.models", ["create_network"]),
    ("src.training", ["build_model", "create_loss", "create_lr", "create_optimizer"]),
    ("src.deploy", ["load_network", "load_predictor"])])
def test_packages_export_their_entry_points(package, entry_points):
    module = __import__(package, fromlist=entry_points)
    assert set(entry_points) <= set(module.__all__)
    assert all(callable(getattr(module, name)) for name in entry_points)
    assert module.__doc__ and len(module.__doc__.strip().splitlines()) <= 6


ENTRY_POINTS = ("train.py", "eval.py", "predict.py", "export.py", "serve.py", "label_issues.py")
DOORS = ("src.utils", "src.data", "src.models", "src.training", "src.deploy", "src.recipe")
# Imported by name besides the doors: the two set before MindSpore loads, and the web
# service's modules (serve.py alone), which the doors leave out because they import the web
# stack the other entry points do not need.
BESIDE_THE_DOORS = ("src.env", "src.startup", "src.deploy.serving", "src.recipe.serving")


def side_doors(paths):
    """``file: module`` for each import of ``src`` in ``paths`` that is not one of ``DOORS``
    (or ``BESIDE_THE_DOORS``), and each import of another entry point."""
    found = []
    entry_modules = {name[:-3] for name in ENTRY_POINTS}
    for path in paths:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{os.path.basename(path)}: {module}" for module in modules
                      if (module.startswith("src.") and module not in DOORS + BESIDE_THE_DOORS)
                      or module in entry_modules]
    return found


def test_entry_points_reach_the_library_through_the_package_doors():
    """train.py, eval.py, ... import ``src`` through its packages (``from src.training
    import ...``, timm's ``from timm.data import ...``), not module by module, and no entry
    point imports another."""
    assert side_doors([os.path.join(ROOT, name) for name in ENTRY_POINTS]) == []


def test_a_side_door_is_found(tmp_path):
    fake = tmp_path / "train.py"
    fake.write_text("from src.utils import get_logger\nfrom src.utils.config import Config\n"
                    "from predict import main\n")
    assert side_doors([str(fake)]) == ["train.py: src.utils.config", "train.py: predict"]


@pytest.mark.parametrize("door", DOORS)
def test_each_door_exports_what_it_names_once(door):
    """Every name of a door's ``__all__`` is there and is named once; no two doors export one
    name (an entry point's ``from src.X import name`` has one meaning)."""
    module = __import__(door, fromlist=["__all__"])
    assert len(module.__all__) == len(set(module.__all__))
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
    others = set()
    for other in DOORS:
        if other != door:
            others.update(__import__(other, fromlist=["__all__"]).__all__)
    assert sorted(set(module.__all__) & others) == []


def test_every_name_the_entry_points_import_from_a_door_is_exported():
    """A door's ``__all__`` lists what the entry points take from it (package modules taken
    as modules aside), so it reads as the package's public face."""
    missing = []
    for name in ENTRY_POINTS:
        tree = ast.parse(open(os.path.join(ROOT, name), encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in DOORS:
                door = __import__(node.module, fromlist=["__all__"])
                missing += [f"{name}: {node.module}.{alias.name}" for alias in node.names
                            if alias.name not in door.__all__ and importlib.util.find_spec(
                                f"{node.module}.{alias.name}") is None]
    assert missing == []

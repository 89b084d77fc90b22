"""The shape of the code, checked from its source: extension/ is a plain library of one package
per stage, with no import circle, no module over 500 lines and no reaching into private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "extension"
MAX_LINES = 500
STAGE_PACKAGES = ("plan", "tokenizer", "mining", "rows", "training", "selection", "evaluation", "publishing")
SERVICE_ONLY = {"fastapi", "starlette", "celery", "sqlalchemy", "uvicorn", "app", "worker"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in `path`, at any depth, relative
    imports resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


LIBRARY_FILES = sorted(LIBRARY.rglob("*.py"))
MODULES = {module_name(path) for path in LIBRARY_FILES}


def resolved(target: str, names: list[str]) -> list[str]:
    """The library modules an import statement loads (`from pkg import module` loads the module)."""
    loaded = [target] if target in MODULES else []
    loaded += [f"{target}.{name}" for name in names if f"{target}.{name}" in MODULES]
    return loaded


def test_the_library_imports_nothing_of_the_service():
    offenders = [(module_name(path), target) for path in LIBRARY_FILES for target, _ in imports(path)
                 if target.split(".")[0] in SERVICE_ONLY]
    assert offenders == []


def test_no_module_of_the_library_is_over_500_lines():
    long = {module_name(path): n for path in LIBRARY_FILES if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_one_package_per_stage_each_saying_what_it_holds():
    top = sorted(p.name for p in LIBRARY.glob("*.py"))
    assert top == ["__init__.py", "errors.py", "live.py", "pipeline.py"]
    for package in STAGE_PACKAGES:
        init = LIBRARY / package / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{package}/__init__.py says nothing of what it holds"


def test_no_import_circle_between_library_modules():
    def ancestors(module: str) -> set[str]:
        parts = module.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    # A module's own packages are loaded before it (`from . import sibling` adds nothing), and a
    # package's __init__ importing its modules is how packages work, not a circle.
    graph = {module_name(path): {m for target, names in imports(path) for m in resolved(target, names)} - ancestors(module_name(path))
             for path in LIBRARY_FILES}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def _private_imports(paths, owner_of) -> list[tuple[str, str, str]]:
    found = []
    for path in paths:
        for target, names in imports(path):
            for name in names:
                if name.startswith("_") and not name.startswith("__") and owner_of(target) != owner_of(module_name(path)):
                    found.append((module_name(path), target, name))
    return found


def test_no_stage_reaches_into_another_stages_private_names():
    def stage_of(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in STAGE_PACKAGES else module

    assert _private_imports(LIBRARY_FILES, stage_of) == []


def test_no_test_or_benchmark_imports_a_private_name():
    files = sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "benchmarks").glob("*.py"))
    found = [(m, t, n) for m, t, n in _private_imports(files, lambda module: module)
             if t.split(".")[0] in {"extension", "app", "worker"}]
    assert found == []


@pytest.mark.parametrize("stage", ["load", "mine", "extend", "init", "generate", "train", "select", "evaluate", "publish"])
def test_run_calls_every_stage_once_in_order(stage):
    from extension.plan.spec import STAGES

    source = (LIBRARY / "pipeline.py").read_text()
    run = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "run")
    entered = [node.args[0].value for node in ast.walk(run) if isinstance(node, ast.Call)
               and getattr(node.func, "id", None) == "stage" and node.args and isinstance(node.args[0], ast.Constant)]
    assert entered.count(stage) == 1
    assert sorted(entered, key=STAGES.index) == sorted(entered, key=lambda name: [n.lineno for n in ast.walk(run)
                                                                                     if isinstance(n, ast.Constant) and n.value == name][0])

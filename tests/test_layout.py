"""The layout's rules, checked on the source (README "Layout"): no import cycle between
modules, and every package imports only the packages upstream of it in the data flow

    open1b (shared base)      kernels (a leaf)
    open1b_data: formats -> ingest, stream -> explore -> cli
    open1b_train -> open1b_eval -> open1b_audit (the run explorer in site/; verify-model
    checks exports in open1b_eval's format)
    testkit (what tests and benchmarks share): any of them, never tests/

Imports under ``if TYPE_CHECKING:`` are type annotations only and do not count; imports
inside functions do (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("open1b", "open1b_kernels", "open1b_data", "open1b_train", "open1b_audit", "open1b_eval",
            "testkit")
# what is shipped (pyproject.toml's package list; testkit is not) and the folders of a checkout
# that import the packages (never shipped)
SHIPPED = PACKAGES[:-1]
CHECKOUT = ("benchmarks", "scripts")

# package prefix -> prefixes it may import (besides itself and the standard library)
ALLOWED = {
    "open1b": (),
    "open1b_kernels": (),
    "open1b_data.errors": ("open1b",),
    "open1b_data.storage": ("open1b", "open1b_data.errors", "open1b_data.storage_errors"),
    "open1b_data.storage_errors": ("open1b", "open1b_data.errors"),
    "open1b_data.formats": ("open1b", "open1b_data.errors", "open1b_data.storage",
                            "open1b_data.storage_errors"),
    "open1b_data.stream": ("open1b", "open1b_data.errors", "open1b_data.storage",
                           "open1b_data.storage_errors", "open1b_data.formats"),
    "open1b_data.explore": ("open1b", "open1b_data.errors", "open1b_data.storage",
                            "open1b_data.storage_errors", "open1b_data.formats",
                            "open1b_data.stream"),
    "open1b_data.ingest": ("open1b", "open1b_data.errors", "open1b_data.storage",
                           "open1b_data.storage_errors", "open1b_data.formats"),
    "open1b_data.cli": ("open1b", "open1b_data"),
    "open1b_data": ("open1b",),                     # open1b_data/__init__.py (lazy names)
    "open1b_train": ("open1b", "open1b_kernels", "open1b_data"),
    "open1b_audit": ("open1b", "open1b_kernels", "open1b_data", "open1b_train", "open1b_eval"),
    "open1b_eval": ("open1b", "open1b_kernels", "open1b_data", "open1b_train"),
    "testkit": SHIPPED,                             # the shared fixtures: never tests
}

# inside open1b_train: the lower layers a step is built from import only the base modules
# (never run, step, loop, the trainer, the engine or the other lower layer); the step and
# the run above them import each other one way only (the cycle test: step imports run)
TRAIN_BASE = ("open1b_train.errors", "open1b_train.config", "open1b_train.params",
              "open1b_train.model", "open1b_train.statehash")
INSIDE = {
    "open1b_train.memory": TRAIN_BASE,
    "open1b_train.reduction": TRAIN_BASE,
    "open1b_train.optimstate": (),
}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            mods[_module(path)] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        deps: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    up = here[:len(here) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # ``from pkg import _ext`` of a compiled extension depends on the
                # extension, not on the package that holds it
                names = [a.name for a in node.names
                         if not (a.name.startswith("_") and f"{base}.{a.name}" not in mods)]
                targets = [f"{base}.{n}" for n in names]
                if any(t not in mods for t in targets):     # a name defined in ``base``
                    targets.append(base)
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _allowed(module: str) -> tuple[str, ...]:
    best = max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)
    return ALLOWED[best]


def test_every_package_imports_only_what_is_upstream_of_it():
    bad = []
    for mod, deps in imports().items():
        own = (mod.split(".")[0] if not mod.startswith("open1b_data.")
               else ".".join(mod.split(".")[:2]))
        for d in deps:
            if d == own or d.startswith(own + ".") or d.startswith(mod):
                continue
            if d == "open1b_data" and mod.startswith("open1b_data."):
                continue                  # the package root: its version and lazy names
            if not any(d == p or d.startswith(p + ".") for p in _allowed(mod)):
                bad.append(f"{mod} -> {d}")
    assert bad == []


def test_the_lower_layers_of_a_step_import_only_the_base_of_open1b_train():
    bad = []
    for mod, deps in imports().items():
        rule = [p for p in INSIDE if mod == p or mod.startswith(p + ".")]
        if not rule:
            continue
        own = rule[0]
        for d in deps:
            inside = d == own or d.startswith(own + ".")
            if d.startswith("open1b_train.") and not inside and d not in INSIDE[own]:
                bad.append(f"{mod} -> {d}")
    assert bad == []


def test_no_module_imports_itself_back_through_others():
    graph = imports()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def test_nothing_outside_tests_imports_tests():
    # benchmarks and scripts share fixtures with the tests through testkit, never tests/
    bad = [f"{p.relative_to(ROOT)} -> {n}" for top in PACKAGES + CHECKOUT
           for p in sorted((ROOT / top).rglob("*.py")) for n in _imported_names(p)
           if n == "tests" or n.startswith("tests.")]
    assert bad == []


def test_testkit_is_not_shipped():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = setuptools.find_packages(str(ROOT),
                                     include=cfg["tool"]["setuptools"]["packages"]["find"]["include"])
    assert "testkit" not in found and not any(p.startswith("testkit.") for p in found)
    assert {p.split(".")[0] for p in found} == set(SHIPPED)


def test_no_line_ends_in_a_backslash():
    # no backslash line continuation (PEP 8: parentheses), in code or in a string
    found = [f"{p.relative_to(ROOT)}:{i}" for top in PACKAGES + CHECKOUT + ("tests",)
             for p in sorted((ROOT / top).rglob("*.py"))
             for i, line in enumerate(p.read_text().split("\n"), 1) if line.endswith("\\")]
    found += [f"setup.py:{i}" for i, line in enumerate((ROOT / "setup.py").read_text().split("\n"), 1)
              if line.endswith("\\")]
    assert found == []


def test_no_package_folder_is_named_like_build_output():
    named = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
             if p.is_dir() and p.name in ("build", "dist") and "__pycache__" not in p.parts]
    assert named == [] and os.path.isdir(ROOT / "open1b_data" / "formats")

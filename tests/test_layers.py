"""The layers of docs/model.md, read from every module's imports (ast, nothing imported):
the floors below the kernels know nothing of what stands on them, the report nothing of
simpy or calibration, the kernels nothing of YAML, and no npusim modules import each
other round a circle."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "npusim"

# a floor -> the packages and modules it must never import, anywhere in its files
FLOORS = {
    floor: ("npusim.kernels", "npusim.scenario", "npusim.report", "npusim.cli")
    for floor in ("npusim.hw", "npusim.engine", "npusim.runtime", "npusim.workload")
}
FLOORS["npusim.report"] = ("simpy", "npusim.calibrate")
FLOORS["npusim.kernels"] = ("yaml", "npusim.useryaml", "npusim.scenario")


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imported(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement names: `from a import b` names a.b, and a
    too unless every name it takes is a module of package a (a package's face, its
    __init__, is not what `from npusim.cli import run` uses)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*up, base] if base else up)
    names = [f"{base}.{a.name}" for a in node.names]
    return names if all(n in MODULES for n in names) else [base, *names]


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements run at import: the module's own, and those inside its top-level
    if/try blocks (TYPE_CHECKING included), not a function's or a class's body."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            todo += [s for h in node.handlers for s in h.body]
    return out


@cache
def imports(module: str, anywhere: bool) -> frozenset[str]:
    """The names a module imports: at import time, or `anywhere` (function bodies too)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes = ast.walk(tree) if anywhere else _top_level(tree)
    return frozenset(n for node in nodes for n in _imported(node, package))


def npusim_imports(module: str, anywhere: bool) -> set[str]:
    """The npusim modules a module imports (a name that is a module's attribute counts as
    the module; a package's __init__ is not counted as imported through its children)."""
    return {n for n in imports(module, anywhere) if n in MODULES and n != module}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_module_names_are_read() -> None:
    # the parser sees what the files say: a known import of each kind
    assert "npusim.runtime.conditions" in npusim_imports("npusim.runtime.context", False)
    assert "numpy" in imports("npusim.runtime.context", False)
    assert _imported(ast.parse("from . import x").body[0], "npusim.hw") == ["npusim.hw",
                                                                            "npusim.hw.x"]


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_a_floor_imports_nothing_above_it(floor: str) -> None:
    bad = [f"{m} imports {n}" for m in MODULES if _under(m, floor)
           for n in sorted(imports(m, anywhere=True))
           if any(_under(n, above) for above in FLOORS[floor])]
    assert bad == []


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of the graph ([] when there is none), by depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("anywhere", [False, True], ids=["at-import", "anywhere"])
def test_no_npusim_modules_import_each_other_round_a_circle(anywhere: bool) -> None:
    graph = {m: npusim_imports(m, anywhere) for m in MODULES}
    assert _circle(graph) == []


def test_the_parser_imports_nothing_that_imports_the_commands_back() -> None:
    seen: set[str] = set()
    todo = ["npusim.cli.parser"]
    while todo:
        m = todo.pop()
        for n in npusim_imports(m, anywhere=True) - seen:
            seen.add(n)
            todo.append(n)
    back = sorted(m for m in seen if not _under(m, "npusim.cli")
                  and any(_under(n, "npusim.cli") for n in imports(m, anywhere=True)))
    assert back == []

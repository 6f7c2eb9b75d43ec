"""The package's import graph: no import circles, packages layered, and tools/ folders layered.

Every module of the packages is read with `ast` (nothing is imported): its imports at module
level, inside functions and under `if TYPE_CHECKING:` all count, relative ones resolved. An
import of `a.b` where `b` is a module is an edge to `a.b`, else (a name defined in `a`) an edge
to `a`.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the packages, lowest first: a package imports only packages before it
PACKAGES = ("common", "capture", "queries", "lowlevel", "highlevel", "tools")
#: first-party code outside the packages, which no package may import
OUTSIDE = ("bench", "tests")
#: the folders (and top-level modules) of tools/, lowest first: one imports only those before
#: it. `tools` is the package's own `__init__`; the traffic generators and the thesis
#: experiments sit beside the application, under the commands that run them.
TOOLS_FOLDERS = ("tools", "tools.errors", "tools.netflow", "tools.results", "tools.pipeline",
                 "tools.gen", "tools.experiments", "tools.cluster", "tools.serve",
                 "tools.commands", "tools.cli")


@dataclass(frozen=True)
class Import:
    """One import statement's edge: `source` imports `target`, at `path`:`line`."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line})"


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of the packages (a package as its `__init__`)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "__pycache__" in path.parts:   # kernels generated at run time, not the package
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[list[str]]:
    """The candidates of each name an import statement imports, most specific first."""
    if isinstance(node, ast.Import):
        return [[a.name] for a in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    return [[f"{origin}.{a.name}", origin] for a in node.names]


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module that `name` is or is defined in (None: not a module of the packages)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@lru_cache(maxsize=1)
def _imports() -> tuple[dict[str, Path], list[Import], list[Import]]:
    """The modules, the imports among them, and the imports of first-party code outside them
    (each edge once per statement)."""
    modules = _modules()
    edges: dict[Import, None] = {}
    outside: dict[Import, None] = {}
    for module, path in modules.items():
        rel = str(path.relative_to(REPO))
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for candidates in _imported_names(node, module, is_package):
                top = candidates[-1].split(".")[0]
                if top in OUTSIDE:
                    outside[Import(module, candidates[-1], rel, node.lineno)] = None
                    continue
                target = next((t for c in candidates if (t := _owner(c, modules))), None)
                if target is not None and target != module:
                    edges[Import(module, target, rel, node.lineno)] = None
    return modules, list(edges), list(outside)


def _components(nodes, graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _shortest_cycle(start: str, members: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The modules of a shortest circle from `start` back to it, inside one component."""
    before = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while before[path[-1]] is not None:
                    path.append(before[path[-1]])
                return [*reversed(path), start]
            if w not in before:
                before[w] = v
                queue.append(w)
    return [start]


def test_no_import_circles():
    modules, edges, _ = _imports()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    where: dict[tuple[str, str], Import] = {}
    for e in edges:
        graph[e.source].add(e.target)
        where.setdefault((e.source, e.target), e)
    circles = _components(sorted(modules), graph)
    report = []
    for members in circles:
        cycle = _shortest_cycle(members[0], set(members), graph)
        steps = "\n".join(f"      {where[a, b]}" for a, b in zip(cycle, cycle[1:]))
        report.append(f"  {', '.join(members)}\n    for example:\n{steps}")
    if circles:
        pytest.fail(f"{len(circles)} import circle(s) among the modules (move what both sides "
                    f"use one level down):\n" + "\n".join(report), pytrace=False)


def test_packages_import_only_lower_packages():
    _, edges, outside = _imports()
    rank = {p: i for i, p in enumerate(PACKAGES)}
    upward = [e for e in edges
              if rank[e.target.split(".")[0]] > rank[e.source.split(".")[0]]]
    report = [f"  {e}: {e.source.split('.')[0]} is below {e.target.split('.')[0]}"
              for e in upward]
    report += [f"  {e}: {e.target.split('.')[0]} is not part of the packages" for e in outside]
    if report:
        pytest.fail(f"imports against the layering {' -> '.join(PACKAGES)}:\n"
                    + "\n".join(report), pytrace=False)


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_tools_folders_import_only_lower_folders():
    modules, edges, _ = _imports()
    rank = {f: i for i, f in enumerate(TOOLS_FOLDERS)}
    unknown = sorted({_folder(m) for m in modules if m.startswith("tools")} - set(rank))
    report = [f"  {f}: a folder of tools/ that TOOLS_FOLDERS does not place" for f in unknown]
    upward: dict[tuple[str, str], list[Import]] = {}
    for e in edges:
        if not (e.source.startswith("tools") and e.target.startswith("tools")):
            continue
        a, b = _folder(e.source), _folder(e.target)
        if a != b and a in rank and b in rank and rank[b] > rank[a]:
            upward.setdefault((a, b), []).append(e)
    for (a, b), found in sorted(upward.items()):
        report.append(f"  {a} imports {b}, a later folder:")
        report += [f"      {e}" for e in found]
    if report:
        pytest.fail(f"tools/ folders against their layering {' -> '.join(TOOLS_FOLDERS[1:])} "
                    f"(tools.gen and tools.experiments beside the application, under "
                    f"tools.cluster):\n" + "\n".join(report), pytrace=False)

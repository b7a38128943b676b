"""Fail on any import cycle inside a package (default: infertune).

Builds the package's import graph with grimp (installed with import-linter), finds its strongly
connected components and reports each one of more than one module with one concrete cycle through
it, as a chain of modules. Every import counts, also one inside a function (a lazy import still
ties the two modules together); imports under `if TYPE_CHECKING:` do not, as they never run.

    .venv/bin/python scripts/check_import_cycles.py            # infertune, as installed
    .venv/bin/python scripts/check_import_cycles.py pkg other  # other packages on sys.path

Exit status: 0 without cycles, 1 with (each printed), 2 when a package cannot be found.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Iterable, Mapping

import grimp

Graph = Mapping[str, set[str]]


def import_graph(packages: Iterable[str]) -> dict[str, set[str]]:
    """module -> the other modules of the same packages it imports directly (a module that
    imports itself, as a `__main__` block may, is no cycle)."""
    first, *rest = packages
    graph = grimp.build_graph(first, *rest, cache_dir=None, exclude_type_checking_imports=True)
    return {m: set(graph.find_modules_directly_imported_by(m)) - {m} for m in sorted(graph.modules)}


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components (iterative: no recursion limit), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return sorted(components, key=lambda c: (-len(c), c))


def one_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component:
    [a, b, ..., a]."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start} in its own component")


def cycles(graph: Graph) -> list[tuple[list[str], list[str]]]:
    """(component, one cycle through it) for each component of more than one module."""
    return [(c, one_cycle(graph, c)) for c in strongly_connected(graph) if len(c) > 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("packages", nargs="*", default=["infertune"])
    args = parser.parse_args(argv)
    try:
        graph = import_graph(args.packages)
    except (ValueError, ModuleNotFoundError) as exc:
        print(f"check_import_cycles: {exc}", file=sys.stderr)
        return 2
    found = cycles(graph)
    names = ", ".join(args.packages)
    if not found:
        print(f"No import cycles in {names} ({len(graph)} modules).")
        return 0
    print(f"{len(found)} import cycle(s) in {names}:")
    for component, cycle in found:
        print(f"\n  {len(component)} modules import each other: {', '.join(component)}")
        print("  for example: " + " -> ".join(cycle))
    return 1


if __name__ == "__main__":
    sys.exit(main())

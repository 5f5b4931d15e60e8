"""carry's import graph, read with `ast` (imports inside functions and under TYPE_CHECKING count too): it has no
cycle, and, once the modules live in subpackages, each subpackage imports only what docs/architecture.md says it
may (RULES below, the same table)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "carry"

# What each subpackage may import (besides itself), as docs/architecture.md lists it. Checked for every module
# that lives in one of these subpackages; while carry is flat there is none, and the check has nothing to do.
RULES: dict[str, set[str]] = {
    "util": set(),
    "source": {"util"},
    "binaries": {"util", "source"},
    "wheelbuild": {"util", "source", "binaries"},
    "image": {"util", "source", "binaries", "wheelbuild", "trust"},
    "verdicts": {"util", "source"},
    "gputest": {"util", "source", "binaries", "wheelbuild", "image", "verdicts"},
    "trust": {"util"},
}
# The top-level modules every subpackage may use: the typed, resolved options everything is handed.
SHARED = {"config", "arch", "platforms", "version", "__init__"}


def modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name (without the package) -> file, for every module of the package, subpackages too."""
    base = root / package
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts) or "__init__"] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The known module `name` (dotted, without the package) is, or is inside; None if none."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(path: Path, module: str, known: dict[str, Path], package: str = PACKAGE) -> set[str]:
    """The package's modules `module` imports anywhere in its file: `from carry import x`, `from carry.x import y`,
    `import carry.x`, relative imports."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from carry.x import y`: the module carry.x.y where there is one, else carry.x (y is a name in it)
            if node.level:
                here = module.split(".") if module != "__init__" else []
                anchor = here if is_package else here[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([package, *anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            prefix = f"{package}."
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}".removeprefix(prefix) in known else base
                for alias in node.names
            ]
        for target in targets:
            if target == package or not target.startswith(package + "."):
                continue
            hit = _resolve(target[len(package) + 1 :], known)
            if hit is not None and hit != module:
                found.add(hit)
    return found


def graph(root: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports_of(path, name, known, package) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one, as a closed path ["a", "b", "a"]; [] if none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_path_in(component, edges) for component in components]


def _path_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in component {component}")


def describe(cycle: list[str]) -> str:
    return " -> ".join(cycle)


def rule_breaks(edges: dict[str, set[str]], rules: dict[str, set[str]] = RULES) -> list[str]:
    """`a.x -> b.y` for each import from subpackage a into subpackage b that RULES does not allow a."""
    breaks = []
    for module, targets in sorted(edges.items()):
        family = module.split(".")[0] if "." in module else None
        if family not in rules:
            continue
        for target in sorted(targets):
            other = target.split(".")[0] if "." in target or target in rules else None
            if other is None:
                if target not in SHARED:
                    breaks.append(f"{module} -> {target} (a top-level module; {family} may use only {sorted(SHARED)})")
            elif other != family and other not in rules[family]:
                breaks.append(f"{module} -> {target} ({family} may import {sorted(rules[family]) or 'none'})")
    return breaks


# --- carry itself -------------------------------------------------------------------------------------------


def test_carry_has_no_import_cycle():
    found = cycles(graph(ROOT))
    assert not found, "import cycles in carry: " + "; ".join(describe(cycle) for cycle in found)


def test_the_graph_sees_carry_s_real_imports():
    edges = graph(ROOT)
    assert len(edges) > 40, sorted(edges)
    commands = next(name for name in edges if name.endswith("commands") and not name.startswith("cli."))  # Session's
    assert len(edges[commands]) > 10, edges[commands]  # its imports are inside functions: they count


def test_subpackages_import_only_what_the_architecture_allows():
    edges = graph(ROOT)
    assert not rule_breaks(edges), "\n".join(rule_breaks(edges))


def test_the_rules_are_the_ones_docs_architecture_lists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for family, allowed in RULES.items():
        line = next((line for line in text.splitlines() if line.startswith(f"| `{family}/`")), None)
        assert line is not None, f"docs/architecture.md: no row for {family}/"
        cell = line.split("|")[3]
        listed = {word.strip("` /") for word in cell.split(",") if word.strip("` /") and word.strip() != "nothing"}
        assert listed == allowed, f"{family}/: docs say {sorted(listed)}, RULES say {sorted(allowed)}"


# --- the finder on a package written here ---------------------------------------------------------------------


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


SMALL = {
    "__init__.py": "",
    "a.py": "from carry import b\n",
    "b.py": "from carry.c import thing\n",
    "c.py": "import os\nthing = 1\n",
    "d.py": "def later():\n    import carry.a\n",
}


def test_a_package_without_a_cycle_passes(tmp_path):
    edges = graph(write_package(tmp_path, SMALL))
    assert edges["a"] == {"b"} and edges["b"] == {"c"} and edges["d"] == {"a"}
    assert cycles(edges) == []


@pytest.mark.parametrize(
    "closing",
    [
        "def f():\n    from carry import a\n",  # lazy, inside a function
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from carry.a import x\n",  # for type hints only
        "import carry.a\n",
        "from . import a\n",
    ],
)
def test_a_cycle_added_by_hand_fails_naming_it(tmp_path, closing):
    root = write_package(tmp_path, {**SMALL, "c.py": closing})
    found = cycles(graph(root))
    assert [describe(cycle) for cycle in found] == ["a -> b -> c -> a"]


def test_cycles_inside_subpackages_are_named_with_their_subpackage(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "util/__init__.py": "",
            "source/__init__.py": "",
            "util/fsutil.py": "from carry.source.git import run\n",
            "source/git.py": "from ..util import fsutil\n",
        },
    )
    edges = graph(root)
    assert cycles(edges) == [["source.git", "util.fsutil", "source.git"]]
    assert rule_breaks(edges) == ["util.fsutil -> source.git (util may import none)"]


def test_rule_breaks_name_the_import(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "config.py": "",
            "verdicts/__init__.py": "",
            "image/__init__.py": "",
            "verdicts/drop.py": "from carry.image import container\nfrom carry import config\n",
            "image/container.py": "",
            "cli.py": "from carry.verdicts import drop\n",
        },
    )
    assert rule_breaks(graph(root)) == ["verdicts.drop -> image.container (verdicts may import ['source', 'util'])"]

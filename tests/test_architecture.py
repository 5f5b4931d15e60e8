"""carry's import graph, read with `ast` (imports inside functions and under TYPE_CHECKING count too): it has no
cycle between modules, none between rooms (each subpackage, each family of image/, each shared top-level module),
and each room imports only what docs/architecture.md says it may (RULES below, the same table). And carry runs
other programs only through its one runner (carry/util/run.py), each run with a timeout."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "carry"

# What each room may import (besides itself), as docs/architecture.md lists it: a subpackage (`util`), a family of
# image/ (`image.buildkit`; `image` is image/'s own top: what the families share), or a shared top-level module. A
# room outside image/ that may import `image` may import every family of it.
RULES: dict[str, set[str]] = {
    "util": set(),
    "arch": {"util"},
    "platforms": {"util"},
    "version": {"util"},
    "config": {"util", "arch", "platforms"},
    "source": {"util"},
    "binaries": {"util", "source"},
    "wheelbuild": {"util", "source", "binaries"},
    "image": {"util", "source", "binaries", "wheelbuild", "trust"},
    "image.buildkit": {"util", "source", "binaries", "wheelbuild", "image"},
    "image.locked": {"util", "source", "binaries", "wheelbuild", "image", "image.buildkit"},
    "image.inspect": {"util", "source", "binaries", "wheelbuild", "trust", "image", "image.locked"},
    "verdicts": {"util", "source"},
    "gputest": {"util", "source", "binaries", "wheelbuild", "image", "verdicts"},
    "trust": {"util"},
    "app": {"util", "source", "binaries", "wheelbuild", "image", "verdicts", "gputest", "trust"},
}
# The top-level modules every room above them may use besides its rules (not util/, and not one another unless
# RULES says so): the typed, resolved options everything is handed.
SHARED = {"config", "arch", "platforms", "version"}
# The subpackages whose subpackages are rooms of their own.
FAMILIES = {"image"}


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


def room(module: str, known: Iterable[str] = ()) -> str:
    """The room a module lives in: its subpackage (`source`), its family of image/ (`image.locked`: a subpackage
    of image/ among the `known` modules), or, for a top-level module, itself (`config`)."""
    parts = module.split(".")
    family = ".".join(parts[:2])
    if parts[0] in FAMILIES and len(parts) > 1 and (len(parts) > 2 or any(k.startswith(f"{family}.") for k in known)):
        return family
    return parts[0]


def _may(importer: str, target: str, rules: dict[str, set[str]]) -> bool:
    allowed = rules[importer]
    if target == importer or target in allowed:
        return True
    package = target.split(".")[0]
    if package != importer.split(".")[0] and package in allowed:  # `image` from outside image/: every family
        return True
    return target in SHARED and importer != "util" and importer not in SHARED


def rule_breaks(edges: dict[str, set[str]], rules: dict[str, set[str]] = RULES) -> list[str]:
    """`a.x -> b.y` for each import from room a into room b that RULES does not allow a."""
    breaks = []
    for module, targets in sorted(edges.items()):
        here = room(module, edges)
        if here not in rules:
            continue
        for target in sorted(targets):
            there = room(target, edges)
            if _may(here, there, rules):
                continue
            if there not in rules and there not in SHARED and "." not in target:
                breaks.append(f"{module} -> {target} (a top-level module above the rooms; {here} may not use it)")
            else:
                breaks.append(f"{module} -> {target} ({here} may import {sorted(rules[here]) or 'none'})")
    return breaks


def rooms(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between rooms: room -> the other rooms its modules import."""
    found: dict[str, set[str]] = {}
    for module, targets in edges.items():
        here = room(module, edges)
        found.setdefault(here, set()).update(room(target, edges) for target in targets if room(target, edges) != here)
    return found


def room_loops(edges: dict[str, set[str]]) -> list[str]:
    """Each loop between rooms, named with the module imports that make every step of it:
    `platforms -> util -> platforms (platforms -> util.errors; util.index -> platforms)`."""
    named = []
    for loop in cycles(rooms(edges)):
        steps = []
        for here, there in zip(loop, loop[1:]):
            made = sorted(
                f"{module} -> {target}"
                for module, targets in edges.items()
                if room(module, edges) == here
                for target in targets
                if room(target, edges) == there
            )
            steps.append(made[0] + (f" (+{len(made) - 1} more)" if len(made) > 1 else ""))
        named.append(f"{describe(loop)} ({'; '.join(steps)})")
    return named


# --- carry itself -------------------------------------------------------------------------------------------


@functools.cache
def carry_graph() -> dict[str, set[str]]:
    """carry's own import graph, read once for every test here (none changes it)."""
    return graph(ROOT)


def test_carry_has_no_import_cycle():
    found = cycles(carry_graph())
    assert not found, "import cycles in carry: " + "; ".join(describe(cycle) for cycle in found)


def test_the_graph_sees_carry_s_real_imports():
    edges = carry_graph()
    assert len(edges) > 40, sorted(edges)
    reached = set().union(*(edges[name] for name in edges if room(name, edges) == "app"))  # the application layer's
    assert len(reached) > 10, reached  # its imports are inside functions: they count


def test_no_loop_between_rooms():
    found = room_loops(carry_graph())
    assert not found, "import loops between carry's rooms: " + "; ".join(found)


def test_every_room_is_checked():
    """Every subpackage and every family of image/ has its rules; so do the shared top-level modules."""
    edges = carry_graph()
    packaged = {room(module, edges) for module in edges if "." in module}
    assert packaged - {"cli"} <= set(RULES), sorted(packaged - {"cli"} - set(RULES))
    assert {"image", "image.buildkit", "image.locked", "image.inspect"} <= packaged
    assert set(RULES) >= SHARED


def test_rooms_import_only_what_the_architecture_allows():
    edges = carry_graph()
    assert not rule_breaks(edges), "\n".join(rule_breaks(edges))


def _docs_key(name: str) -> str:
    """A room as docs/architecture.md's table names it: `image/locked/`, `config/` (a shared package), `arch` (a
    shared module)."""
    return name if name in SHARED and not (ROOT / PACKAGE / name).is_dir() else name.replace(".", "/") + "/"


def _docs_rows() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0].count("`") == 2:
            rows[cells[0].strip("`")] = cells
    return rows


def _listed(cell: str) -> set[str]:
    words = {word.strip().strip("`").strip() for word in cell.split(",")}
    return {word.rstrip("/").replace("/", ".") for word in words if word and word != "nothing"}


def test_the_rules_are_the_ones_docs_architecture_lists():
    rows = _docs_rows()
    for name, allowed in RULES.items():
        assert _docs_key(name) in rows, f"docs/architecture.md: no row for {_docs_key(name)}"
        listed = _listed(rows[_docs_key(name)][2])
        assert listed == allowed, f"{_docs_key(name)}: docs say {sorted(listed)}, RULES say {sorted(allowed)}"


def test_the_modules_docs_architecture_lists_are_the_rooms_own():
    edges = carry_graph()
    rows = _docs_rows()
    for name in RULES:
        own = {module.rsplit(".", 1)[1] for module in edges if room(module, edges) == name and module != name}
        if name in SHARED and not own:
            continue  # a shared module, not a package: its row says what it holds
        listed = _listed(rows[_docs_key(name)][1])
        assert listed == own, f"{_docs_key(name)}: docs list {sorted(listed)}, the room holds {sorted(own)}"


# --- programs run through the one runner ----------------------------------------------------------------------

RUNNER = "util.run"  # carry.util.run: the one module that starts a process itself
RUNNER_CALLS = {"execute", "spawn"}
# Every way Python starts another program, by the module that offers it.
STARTERS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "pty": {"spawn", "fork"},
}


def _names(tree: ast.AST) -> tuple[dict[str, str], dict[str, str]]:
    """(local name -> module, for `import subprocess [as sp]`; local name -> "module.function", for `from
    subprocess import run [as r]`), over STARTERS' modules and carry.util.run."""
    modules, functions = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in STARTERS or alias.name == f"{PACKAGE}.{RUNNER}":
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level:
            for alias in node.names:
                if node.module in STARTERS or node.module == f"{PACKAGE}.{RUNNER}":
                    functions[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif f"{node.module}.{alias.name}" == f"{PACKAGE}.{RUNNER}":
                    modules[alias.asname or alias.name] = f"{PACKAGE}.{RUNNER}"
    return modules, functions


def _called(node: ast.Call, modules: dict[str, str], functions: dict[str, str]) -> str | None:
    """ "module.function" a call names, when it is one of STARTERS' or the runner's; else None."""
    func = node.func
    if isinstance(func, ast.Name) and func.id in functions:
        return functions[func.id]
    if isinstance(func, ast.Attribute):
        value = func.value
        dotted = value.id if isinstance(value, ast.Name) else None
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):  # carry.util.run.execute
            dotted = f"{value.value.id}.{value.attr}"
        if dotted in modules:
            return f"{modules[dotted]}.{func.attr}"
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Attribute):
            chain = ast.unparse(value)
            if chain in modules.values():
                return f"{chain}.{func.attr}"
    return None


def process_calls(path: Path) -> tuple[list[str], list[str]]:
    """(direct starts of a program: `line: subprocess.run`; runner calls without a timeout: `line: execute`) in
    one file."""
    tree = ast.parse(path.read_text(), str(path))
    modules, functions = _names(tree)
    direct, untimed = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = _called(node, modules, functions)
        if called is None:
            continue
        module, _, name = called.rpartition(".")
        timed = {keyword.arg for keyword in node.keywords}
        if module in STARTERS and name in STARTERS[module]:
            direct.append(f"{node.lineno}: {called}")
        elif module == f"{PACKAGE}.{RUNNER}" and name in RUNNER_CALLS and "timeout" not in timed:
            untimed.append(f"{node.lineno}: {name}")
    return direct, untimed


def test_programs_run_only_through_the_runner():
    found = [
        f"{path.relative_to(ROOT)}:{hit}"
        for module, path in modules(ROOT).items()
        if module != RUNNER
        for hit in process_calls(path)[0]
    ]
    assert not found, "a program started outside carry/util/run.py (use carry.util.run.execute): " + "; ".join(found)


def test_every_run_names_its_timeout():
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in modules(ROOT).values() for hit in process_calls(path)[1]]
    assert not found, "carry.util.run.execute without timeout=: " + "; ".join(found)


def test_the_runner_is_what_carry_calls():
    """The finder sees carry's own calls: the runner's, in most families, and the runner's own start."""
    runs = set()
    for module, path in modules(ROOT).items():
        parsed = ast.parse(path.read_text())
        names = _names(parsed)
        calls = [_called(node, *names) for node in ast.walk(parsed) if isinstance(node, ast.Call)]
        if f"{PACKAGE}.{RUNNER}.execute" in calls:
            runs.add(module)
    assert {"source.git", "image.buildkit.container", "gputest.testrun", "wheelbuild.pep517"} <= runs, sorted(runs)
    assert process_calls(modules(ROOT)[RUNNER])[0], "the runner itself starts its programs with subprocess"


@pytest.mark.parametrize(
    "text, direct, untimed",
    [
        ("import subprocess\nsubprocess.run(['x'])\n", ["2: subprocess.run"], []),
        ("import subprocess as sp\nsp.Popen(['x'])\n", ["2: subprocess.Popen"], []),
        ("from subprocess import check_output as co\nco(['x'])\n", ["2: subprocess.check_output"], []),
        ("import os\nos.system('x')\n", ["2: os.system"], []),
        ("def f():\n    import os\n    os.execvp('x', ['x'])\n", ["3: os.execvp"], []),
        ("from carry.util.run import execute\nexecute(['x'])\n", [], ["2: execute"]),
        ("from carry.util import run\nrun.execute(['x'], cwd='.')\n", [], ["2: execute"]),
        ("import carry.util.run\ncarry.util.run.execute(['x'])\n", [], ["2: execute"]),
        ("from carry.util.run import execute\nexecute(['x'], timeout=5)\n", [], []),
        ("import subprocess\nsubprocess.DEVNULL\nraise subprocess.TimeoutExpired('x', 1)\n", [], []),
    ],
)
def test_a_direct_start_or_an_untimed_run_is_found(tmp_path, text, direct, untimed):
    path = tmp_path / "module.py"
    path.write_text(text)
    assert process_calls(path) == (direct, untimed)


# --- one output channel -----------------------------------------------------------------------------------------

# carry prints its progress through carry.util.reporter (a context variable), never through a stream or callback
# handed down: no function takes one of these parameters, and Progress (the line writer) is made only there.
OUTPUT_PARAMETERS = {"progress", "say"}
REPORTER = "util.reporter"


def output_parameters(path: Path) -> list[str]:
    """`line: function(parameter)` for every function or lambda of one file that takes a progress or say."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            name = getattr(node, "name", "lambda")
            found += [f"{node.lineno}: {name}({a.arg})" for a in every if a is not None and a.arg in OUTPUT_PARAMETERS]
    return found


def progress_made(path: Path) -> list[str]:
    """`line` of every `Progress(...)` call in one file."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        str(node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).rsplit(".", 1)[-1] == "Progress"
    ]


def test_no_function_takes_a_progress_or_say():
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in modules(ROOT).values() for hit in output_parameters(path)]
    assert not found, "call carry.util.reporter (phase, note, warn) instead of passing output down: " + "; ".join(found)


def test_progress_is_made_only_by_the_reporter():
    made = {module: lines for module, path in modules(ROOT).items() if (lines := progress_made(path))}
    assert set(made) == {REPORTER}, made


@pytest.mark.parametrize(
    "text, found",
    [
        ("def f(a, progress):\n    pass\n", ["1: f(progress)"]),
        ("def f(a, *, say=None):\n    pass\n", ["1: f(say)"]),
        ("class C:\n    async def f(self, progress=None):\n        pass\n", ["2: f(progress)"]),
        ("g = lambda say: say\n", ["1: lambda(say)"]),
        ("def f(a, progressed, saying):\n    pass\n", []),
    ],
)
def test_a_progress_or_say_parameter_is_found(tmp_path, text, found):
    path = tmp_path / "module.py"
    path.write_text(text)
    assert output_parameters(path) == found


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


def test_a_loop_between_rooms_is_named_with_the_imports_that_make_it(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "platforms.py": "from carry.util.errors import BadInput\n",
            "util/__init__.py": "",
            "util/errors.py": "",
            "util/index.py": "from carry.platforms import Platform\n",
        },
    )
    edges = graph(root)
    assert cycles(edges) == []  # no module imports itself back: only the rooms loop
    assert room_loops(edges) == ["platforms -> util -> platforms (platforms -> util.errors; util.index -> platforms)"]
    assert rule_breaks(edges) == ["util.index -> platforms (util may import none)"]


def test_a_shared_module_importing_a_family_is_a_loop_and_a_break(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "config.py": "def policy():\n    from carry.binaries.gatepolicy import GatePolicy\n",
            "binaries/__init__.py": "",
            "binaries/gatepolicy.py": "",
            "binaries/treecheck.py": "from carry import config\n",
        },
    )
    edges = graph(root)
    assert room_loops(edges) == [
        "binaries -> config -> binaries (binaries.treecheck -> config; config -> binaries.gatepolicy)"
    ]
    assert rule_breaks(edges) == ["config -> binaries.gatepolicy (config may import ['arch', 'platforms', 'util'])"]


def test_a_shared_package_is_one_room(tmp_path):
    """A shared top-level room made a package (config/): its modules are the room `config`, held to its rules, and
    a module of it importing the package's __init__ that imports it is a cycle."""
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "from carry.config.build import Build\n",
            "config/build.py": "from carry.config.reader import Section\nfrom carry.binaries.gate import check\n",
            "config/reader.py": "from carry.util.errors import BadInput\n",
            "config/image.py": "from carry.config import SHA_RE\n",
            "util/__init__.py": "",
            "util/errors.py": "",
            "binaries/__init__.py": "",
            "binaries/gate.py": "",
        },
    )
    edges = graph(root)
    assert {room(module, edges) for module in edges if module.startswith("config")} == {"config"}
    assert cycles(edges) == []  # config/image.py imports the package, which does not import it
    assert rule_breaks(edges) == ["config.build -> binaries.gate (config may import ['arch', 'platforms', 'util'])"]
    (root / PACKAGE / "config" / "__init__.py").write_text(
        "from carry.config.build import Build\nfrom carry.config import image\n"
    )
    assert cycles(graph(root)) == [["config", "config.image", "config"]]


def test_each_family_of_image_is_a_room_of_its_own(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "image/__init__.py": "",
            "image/attest.py": "def read():\n    from carry.image.inspect import imagefs\n",
            "image/registryhttp.py": "",
            "image/inspect/__init__.py": "",
            "image/inspect/imagefs.py": "from carry.image import registryhttp\n",
            "gputest/__init__.py": "",
            "gputest/testrun.py": "from carry.image.inspect import imagefs\n",
        },
    )
    edges = graph(root)
    assert room("image.inspect.imagefs", edges) == "image.inspect" and room("image.attest", edges) == "image"
    assert room("image.inspect", edges) == "image.inspect"
    assert room_loops(edges) == [
        "image -> image.inspect -> image (image.attest -> image.inspect.imagefs; image.inspect.imagefs -> "
        "image.registryhttp)"
    ]
    # gputest may import `image`: every family of it
    assert rule_breaks(edges) == [
        "image.attest -> image.inspect.imagefs (image may import ['binaries', 'source', 'trust', 'util', 'wheelbuild'])"
    ]


# --- the publish stage: the image families hand over, and reach signing only through its public entry ----------

STAGE = "image.publish"  # the publish stage's one public entry (carry/image/publish.py)
STAGE_INTERNALS = {"image.attest"}  # what the stage is made of, besides every module of trust/
HANDING_OVER = {"image.buildkit", "image.locked"}  # the image families: they build, then hand over to STAGE


def stage_breaks(root: Path, package: str = PACKAGE) -> list[str]:
    """`a.x -> b.y (why)` for each import of an image family that goes past the publish stage's public entry: any
    module of trust/, the stage's internals, or a private name (`_x`) of the stage itself."""
    known, edges = modules(root, package), graph(root, package)
    breaks = []
    for module in sorted(edges):
        if room(module, edges) not in HANDING_OVER:
            continue
        for target in sorted(edges[module]):
            if room(target, edges) == "trust" or target in STAGE_INTERNALS:
                breaks.append(f"{module} -> {target} (an image family reaches it only through {STAGE})")
        for node in ast.walk(ast.parse(known[module].read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == f"{package}.{STAGE}":
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "publish":
                private = [node.attr] if node.attr.startswith("_") else []
            else:
                continue
            breaks += [f"{module} -> {STAGE}.{name} (the stage's own; use its public entry)" for name in private]
    return breaks


def test_image_families_reach_signing_only_through_the_publish_stage():
    assert not stage_breaks(ROOT), "\n".join(stage_breaks(ROOT))


def test_a_family_past_the_publish_stage_is_found(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "image/__init__.py": "",
            "image/publish.py": "from carry.image import attest\n_order = 1\n",
            "image/attest.py": "from carry.trust import attach\n",
            "image/locked/__init__.py": "",
            "image/locked/good.py": "from carry.image import publish\nx = publish.Stage\n",
            "image/locked/sneaky.py": "from carry.image import publish\nx = publish._order\n",
            "image/buildkit/__init__.py": "",
            "image/buildkit/image.py": "from carry.image.attest import Attester\n"
            "from carry.image.publish import _order\n",
            "image/buildkit/sign.py": "def f():\n    from carry.trust.attach import sign\n",
            "trust/__init__.py": "",
            "trust/attach.py": "",
        },
    )
    assert stage_breaks(root) == [
        "image.buildkit.image -> image.attest (an image family reaches it only through image.publish)",
        "image.buildkit.image -> image.publish._order (the stage's own; use its public entry)",
        "image.buildkit.sign -> trust.attach (an image family reaches it only through image.publish)",
        "image.locked.sneaky -> image.publish._order (the stage's own; use its public entry)",
    ]


# --- sizes: no class over 15 methods in the command layer, no function over 100 lines anywhere ----------------

COMMAND_LAYER = ("app", "cli")  # carry/app/ and carry/cli/: what each command is, over the families
MAX_METHODS = 15
MAX_FUNCTION_LINES = 100


def big_classes(path: Path, limit: int = MAX_METHODS) -> list[str]:
    """`line: Name (n methods)` for each class of the file with more than `limit` methods (functions in its body)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if len(methods) > limit:
                found.append(f"{node.lineno}: {node.name} ({len(methods)} methods)")
    return found


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`line: name (n lines)` for each function (or method) of the file longer than `limit` lines, decorators
    left out, its docstring counted."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append(f"{node.lineno}: {node.name} ({lines} lines)")
    return found


def test_no_class_of_the_command_layer_has_over_15_methods():
    found = [
        f"{path.relative_to(ROOT)}:{hit}"
        for module, path in modules(ROOT).items()
        if module.split(".")[0] in COMMAND_LAYER
        for hit in big_classes(path)
    ]
    assert not found, f"over {MAX_METHODS} methods in the command layer (split it by command): " + "; ".join(found)


def test_no_function_in_carry_is_over_100_lines():
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in modules(ROOT).values() for hit in long_functions(path)]
    assert not found, f"over {MAX_FUNCTION_LINES} lines (split it into its steps): " + "; ".join(found)


def test_the_size_finders_see_a_big_class_and_a_long_function(tmp_path):
    path = tmp_path / "module.py"
    body = "".join(f"    def m{i}(self):\n        pass\n" for i in range(16))
    path.write_text("class Big:\n" + body + "\n\ndef long():\n" + "    x = 1\n" * 100 + "\n\nclass Small:\n    pass\n")
    assert big_classes(path) == ["1: Big (16 methods)"]
    assert long_functions(path) == ["36: long (101 lines)"]
    assert big_classes(path, 16) == [] and long_functions(path, 101) == []


# --- one backend seam: the Producer Protocol and its `choose` ----------------------------------------------------


def protocols(path: Path) -> list[str]:
    """The classes of the file that derive from typing.Protocol (`Protocol`, `typing.Protocol`, `Protocol[T]`)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base).split("[")[0].endswith("Protocol") for base in node.bases)
    ]


def _top_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}


def test_one_producer_protocol_with_choose_and_its_callers():
    """Exactly one Protocol for the ways a wheel is made (`Producer`, in wheelbuild/), its module the one with a
    `choose`; the places that pick a producer ask it."""
    found = {module: protocols(path) for module, path in modules(ROOT).items()}
    producers = [f"{module}.{name}" for module, names in found.items() for name in names if "Producer" in name]
    assert producers == ["wheelbuild.producer.Producer"], producers
    choosers = [module for module, path in modules(ROOT).items() if "choose" in _top_functions(path)]
    assert "wheelbuild.producer" in choosers
    assert not [m for m in choosers if m != "wheelbuild.producer" and m.startswith("wheelbuild")], choosers
    edges = carry_graph()
    for caller in ("app.wheel", "app.locked", "app.lock", "wheelbuild.wheel"):
        assert "wheelbuild.producer" in edges[caller], f"{caller} picks a producer without wheelbuild/producer"

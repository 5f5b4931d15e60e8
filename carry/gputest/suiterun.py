"""One side of `suite`: the upstream's own tests checked out of the patched tree, a wheel's environment, and one
pytest run of the selection in it, read back per test id.

The test tree: the top directory of every test path (with its conftest files and data), build.upstream_tests.checkout
and the root's pytest config files, exported from the patched tree (patches may change tests) into
`$CARRY_CACHE/suites/trees/<key>/`, keyed by their git object ids; the upstream's package sources are not there to
shadow the wheel. The environments: the test requirements and the wheel's Requires-Dist made once with uv
(buildenv.py; shared by both sides when their Requires-Dist agree), and per wheel a venv of its own over it holding
the wheel alone (`--no-deps`), keyed by the wheel's sha256 and the deps environment.

The run: `python -m pytest` in the test tree, with a per-test timeout, no network (carry's plugin, pytestplugin.py,
refuses other hosts and writes each outcome as it comes; the hubs' offline switches are set), no GPU,
PYTHONHASHSEED=0 (so pytest-xdist's workers collect the same ids), and HOME and the caches in a scratch directory.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shutil
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carry.config.build import BuildEnvironment, UpstreamTests
from carry.gputest.testrun import purelib
from carry.source import git
from carry.util import reporter, run
from carry.util.digest import sha256
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text
from carry.util.record import field, record
from carry.wheelbuild import buildenv

if TYPE_CHECKING:
    from carry.util.cache import Cache

SUITES_DIR = "suites"
TREE_MARKER = ".carry-tree.json"
ENV_MARKER = "carry-suite-env.json"
FORMAT = 1
PLUGIN_NAME = "carry_suite_plugin"
PLUGIN_FILE = Path(__file__).with_name("pytestplugin.py")
# The files at the root pytest reads its configuration from (and a root conftest), checked out when present.
ROOT_CONFIGS = ("pyproject.toml", "pytest.ini", "setup.cfg", "tox.ini", "conftest.py")
KEPT_ENVS = 4  # wheel venvs kept in suites/envs/, the least recently used beyond them removed (0.8 GB each for vLLM)
SIDE_LIMIT_S = 4 * 3600  # a run past this (a hang outside any test, where pytest-timeout cannot reach) is killed
LOG_TAIL_CHARS = 3000
PASS = ("passed", "xfailed", "xpassed")
FAIL = ("failed", "error")
# Variables a test run must not see: another interpreter's, and what could hold a secret or reach a hub.
DROPPED_PREFIXES = ("PYTHON", "VIRTUAL_ENV", "CONDA", "CARRY_", "UV_", "PIP_")
SECRET_RE = re.compile(r"(TOKEN|PASSWORD|SECRET|CREDENTIAL|_KEY)$|^AWS_|^HF_TOKEN", re.IGNORECASE)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


# --- the test tree --------------------------------------------------------------------------------------------------


@record
class TestTree:
    """The checked-out tests: where, what (path -> git object id), the key naming it, and how it was had."""

    __test__ = False  # not a pytest class
    root: Path
    objects: dict[str, str]
    key: str
    reused: bool
    seconds: float

    def describe(self) -> str:
        how = f"reused {self.seconds:.2f} s" if self.reused else f"exported {self.seconds:.1f} s"
        return f"{', '.join(self.objects)} ({how})"


def test_tree(cache: Cache, mirror: Path, tree: str, tests: UpstreamTests, where: str) -> TestTree:
    """The test tree of `tree` for `tests`; bad input naming a path of the selection the tree does not hold."""
    start = time.monotonic()
    named = {
        **{path: "paths" for path in tests.paths},
        **{d.path: "deselect" for d in tests.deselect},
        **{path: "checkout" for path in tests.checkout},
    }
    present = git.entries(mirror, tree, tuple(named))
    for path, key in named.items():
        if path not in present:
            raise BadInput(
                f"{where}.{key}: {path} is not in the patched tree {tree[:12]} (the pin with the series); "
                f"name a path the upstream has at the pin"
            )
    tops = tuple(dict.fromkeys([*(path.split("/", 1)[0] for path in tests.paths), *tests.checkout, *ROOT_CONFIGS]))
    objects = git.entries(mirror, tree, tops)
    key = sha256(json.dumps({"format": FORMAT, "objects": objects}, sort_keys=True).encode()).hexdigest()
    root = cache.root / SUITES_DIR / "trees" / key[:32]
    if not (root / TREE_MARKER).is_file():
        with cache.lock(f"suite-tree-{root.name}"):
            if not (root / TREE_MARKER).is_file():
                shutil.rmtree(root, ignore_errors=True)
                git.export(mirror, tree, tuple(objects), root)
                atomic_write_text(root / TREE_MARKER, json.dumps({"tree": tree, "objects": objects}, indent=2) + "\n")
                return TestTree(root, objects, key, False, time.monotonic() - start)
    return TestTree(root, objects, key, True, time.monotonic() - start)


# --- the environments -----------------------------------------------------------------------------------------------


@record
class WheelEnv:
    """A wheel's own venv over the deps environment: its interpreter, its site-packages, its key, how it was had."""

    root: Path
    site: Path
    key: str
    deps: buildenv.BuildEnv
    reused: bool
    seconds: float

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def test_requirements(tests: UpstreamTests, where: str) -> tuple[str, ...]:
    """build.upstream_tests.requires, normalized, plus pytest, pytest-timeout, (workers) pytest-xdist unless named."""
    from packaging.requirements import Requirement

    given = [buildenv.normalize_requirement(text, f"{where}.requires") for text in tests.requires]
    names = {Requirement(text).name for text in given}
    wanted = ["pytest", "pytest-timeout", *(["pytest-xdist"] if tests.workers else [])]
    return tuple(given + [name for name in wanted if name not in names])


def deps_env(
    requires_dist: tuple[str, ...], tests: UpstreamTests, environment: BuildEnvironment, cache: Cache, where: str
) -> buildenv.BuildEnv:
    """The environment of a wheel's Requires-Dist and the test requirements (uv, keyed by content, reused)."""
    extra = test_requirements(tests, where)
    indexes = BuildEnvironment(index_url=environment.index_url, extra_index_urls=environment.extra_index_urls)
    spec = buildenv.EnvSpec.resolve(
        (*requires_dist, *extra), indexes, where="the wheel's Requires-Dist and build.upstream_tests.requires"
    )
    with reporter.silenced():  # the suite's own lines say which environment it uses
        return buildenv.ensure(spec, cache.root)


def wheel_env(wheel: Path, digest: str, deps: buildenv.BuildEnv, cache: Cache) -> WheelEnv:
    """`wheel` alone (no dependencies) in a venv of its own whose site-packages come before the deps env's."""
    start = time.monotonic()
    key = sha256(json.dumps({"format": FORMAT, "wheel": digest, "deps": deps.key}).encode()).hexdigest()
    root = cache.root / SUITES_DIR / "envs" / key[:32]
    if (found := _complete_env(root, key, deps, start)) is not None:
        return found
    with cache.lock(f"suite-env-{root.name}"):
        if (found := _complete_env(root, key, deps, start)) is not None:
            return found
        shutil.rmtree(root, ignore_errors=True)
        try:
            site = _make_wheel_env(root, wheel, deps, cache.logs / f"suite-env-{root.name}.log")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        marker = {"key": key, "wheel": wheel.name, "sha256": digest, "deps": deps.key, "site": str(site)}
        atomic_write_text(root / ENV_MARKER, json.dumps(marker, indent=2) + "\n")  # last: complete from here on
    evict(cache, root.parent, KEPT_ENVS)
    return WheelEnv(root, site, key, deps, False, time.monotonic() - start)


def evict(cache: Cache, envs: Path, keep: int) -> list[Path]:
    """Remove the wheel venvs beyond the `keep` used last (their markers' mtimes: touched on each use), each under its
    lock taken without waiting (one in use stays). Returns what went."""
    import filelock

    found = sorted(
        (path for path in envs.iterdir() if (path / ENV_MARKER).is_file()),
        key=lambda path: (path / ENV_MARKER).stat().st_mtime,
        reverse=True,
    )
    removed = []
    for path in found[keep:]:
        try:
            with cache.lock(f"suite-env-{path.name}").acquire(timeout=0):
                shutil.rmtree(path)
                removed.append(path)
        except filelock.Timeout:
            continue
    return removed


def _complete_env(root: Path, key: str, deps: buildenv.BuildEnv, start: float) -> WheelEnv | None:
    try:
        marker = json.loads((root / ENV_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("key") != key or not (root / "bin" / "python").exists():
        return None
    os.utime(root / ENV_MARKER)  # used now: the last to be evicted
    return WheelEnv(root, Path(marker["site"]), key, deps, True, time.monotonic() - start)


def _make_wheel_env(root: Path, wheel: Path, deps: buildenv.BuildEnv, log: Path) -> Path:
    uv = buildenv.find_uv()
    env = buildenv.uv_environ({})
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        _run_logged([uv.path, "venv", "--no-config", "--quiet", "--python", str(deps.python), str(root)], env, handle)
        site = Path(purelib(root / "bin" / "python"))
        (site / "_carry_suite_deps.pth").write_text(f"import site; site.addsitedir({purelib(deps.python)!r})\n")
        install = [uv.path, "pip", "install", "--no-config", "--no-deps", "--no-cache", "--color", "never"]
        _run_logged([*install, "--python", str(root / "bin" / "python"), str(wheel)], env, handle)
    return site


def _run_logged(argv: list[str], env: dict[str, str], log: Any) -> None:
    done = run.execute(argv, timeout=run.NETWORK_S, env=env, text=True)
    log.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise Failed(f"making the test environment: {argv[1]} failed: {said[-1] if said else done.returncode}")


def top_level_modules(wheel: Path) -> tuple[str, ...]:
    """The importable names a wheel installs at the top of site-packages (packages and single modules)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    found = set()
    for name in names:
        first, _, rest = name.partition("/")
        if first.endswith((".dist-info", ".data")):
            continue
        if rest == "__init__.py" or (not rest and first.endswith(".py")):
            found.add(first.removesuffix(".py"))
    return tuple(sorted(found))


# --- one run --------------------------------------------------------------------------------------------------------


@record(kw_only=True)
class Subject:
    """A wheel under test: its file, sha256, distribution name, top-level modules and environment."""

    wheel: Path
    digest: str
    dist: str
    modules: tuple[str, ...]
    env: WheelEnv


@record
class Side:
    """One run's outcome per test id ([outcome, seconds, message]), what did not collect, and about the run."""

    wheel: str
    digest: str
    tests: dict[str, list]
    collect_errors: dict[str, str]
    collected: int | None
    exitstatus: int | None
    seconds: float
    version: str | None = None
    modules: dict[str, str | None] = field(default_factory=dict)
    markers: tuple[str, ...] = ()
    unknown_markers: tuple[str, ...] = ()
    started: bool = False  # pytest configured (its conftest files loaded)
    died: str | None = None  # why the run ended before it finished
    log_tail: str = ""

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(outcome for outcome, *_ in self.tests.values()))

    def describe(self) -> str:
        passed, failed, skipped = tally(self.counts())
        parts = [f"{passed} passed", f"{failed} failed", f"{skipped} skipped"]
        if self.collect_errors:
            parts.append(f"{len(self.collect_errors)} module(s) not collected")
        return f"{', '.join(parts)} in {self.seconds:.1f} s"

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "seconds": round(self.seconds, 3)}

    @classmethod
    def from_json(cls, data: dict) -> Side:
        return cls(
            str(data["wheel"]),
            str(data["digest"]),
            {str(k): list(v) for k, v in data["tests"].items()},
            dict(data["collect_errors"]),
            data["collected"],
            data["exitstatus"],
            float(data["seconds"]),
            data.get("version"),
            dict(data.get("modules") or {}),
            tuple(data.get("markers") or ()),
            tuple(data.get("unknown_markers") or ()),
            bool(data.get("started")),
            data.get("died"),
            str(data.get("log_tail") or ""),
        )


def tally(counts: dict[str, int]) -> tuple[int, int, int]:
    """(passed, failed, skipped) of a run's counts per outcome."""
    return sum(counts.get(o, 0) for o in PASS), sum(counts.get(o, 0) for o in FAIL), counts.get("skipped", 0)


def pytest_argv(python: Path, tests: UpstreamTests) -> list[str]:
    """The pytest command line of a run: the same for both sides."""
    argv = [str(python), "-m", "pytest", "-p", PLUGIN_NAME, "-p", "no:cacheprovider", "-q", "-rN"]
    argv += ["--continue-on-collection-errors", f"--timeout={tests.timeout}"]
    if tests.marker:
        argv += ["-m", tests.marker]
    for deselection in tests.deselect:
        argv += ["--deselect", deselection.target] if deselection.is_id else ["--ignore", deselection.target]
    if tests.workers:
        argv += ["-n", str(tests.workers)]
    return [*argv, "--", *tests.paths]


def run_environment(subject: Subject, tests: UpstreamTests, work: Path, events: Path) -> dict[str, str]:
    """The variables of a run: the caller's without other interpreters', secrets or carry's own; the wheel's venv
    first on PATH; carry's plugin importable; no network, no GPU, fixed hash seed; HOME and caches in `work`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(DROPPED_PREFIXES) and not SECRET_RE.search(name)
    }
    bins = [str(subject.env.root / "bin"), str(subject.env.deps.root / "bin")]
    home = work / "home"
    for directory in (home, work / "cache", work / "plugin", work / "tmp"):
        directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PLUGIN_FILE, work / "plugin" / f"{PLUGIN_NAME}.py")
    return {
        **env,
        "PATH": os.pathsep.join([*bins, env.get("PATH", os.defpath)]),
        "VIRTUAL_ENV": str(subject.env.root),
        "PYTHONPATH": str(work / "plugin"),
        "PYTHONHASHSEED": "0",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(work / "cache"),
        "HF_HOME": str(work / "cache" / "huggingface"),
        "TMPDIR": str(work / "tmp"),
        "CARRY_SUITE_EVENTS": str(events),
        "CARRY_SUITE_MODULES": ",".join(subject.modules),
        "CARRY_SUITE_DIST": subject.dist,
        "CARRY_SUITE_NETWORK": "off",
        **OFFLINE,
        **tests.env,
    }


@record
class Started:
    """A run in progress: its process, where it writes, when it began."""

    subject: Subject
    process: run.Spawned
    events: Path
    log: Path
    clock: float


def start(subject: Subject, tests: UpstreamTests, tree: TestTree, work: Path) -> Started:
    """Start the run of the selection on `subject` in `tree` (its own process group); `work` is its scratch dir."""
    work.mkdir(parents=True, exist_ok=True)
    events, log = work / "events.jsonl", work / "pytest.log"
    env = run_environment(subject, tests, work, events)
    argv = pytest_argv(subject.env.python, tests)
    with open(log, "wb") as handle:
        process = run.spawn(argv, timeout=SIDE_LIMIT_S, log=handle, cwd=tree.root, env=env, own_group=True)
    return Started(subject, process, events, log, time.monotonic())


def wait_for_collection(started: Started, poll_s: float = 0.2) -> int:
    """Block until the run has collected some tests (how many) or ended (0): a run that collected none is waited
    for, so that what it says (no test, an unknown marker) is judged first."""
    while started.process.poll() is None:
        for event in _events(started.events):
            if event["event"] == "collected" and event["ids"]:
                return len(event["ids"])
        time.sleep(poll_s)
    return 0


def finish(started: Started, label: str = "") -> Side:
    """Wait for the run (killed past SIDE_LIMIT_S) and read it back per test id; with a `label`, say how it went."""
    status = started.process.wait()
    started.process.kill()  # past the limit; or what a test left running in the background
    seconds = time.monotonic() - started.clock
    side = read_events(started, status, seconds)
    if label:
        reporter.phase("suite", f"{label}: {side.describe()}")
    return side


def read_events(started: Started, status: int | None, seconds: float) -> Side:
    events = _events(started.events)
    tests, died = merge(events, status)
    configured = next((e for e in events if e["event"] == "configured"), {})
    finished = next((e for e in events if e["event"] == "finished"), None)
    collected = next((e["ids"] for e in events if e["event"] == "collected"), None)
    if finished is None and died is None:
        died = "timed out: killed" if status is None else f"ended (exit {status}) before it finished"
    return Side(
        wheel=started.subject.wheel.name,
        digest=started.subject.digest,
        tests=tests,
        collect_errors={e["id"]: e["message"] for e in events if e["event"] == "collect-error"},
        collected=len(collected) if collected is not None else None,
        exitstatus=finished["exitstatus"] if finished else status,
        seconds=seconds,
        version=finished.get("version") if finished else None,
        modules=dict(finished.get("modules") or {}) if finished else {},
        markers=tuple(configured.get("markers") or ()),
        unknown_markers=tuple(configured.get("unknown_markers") or ()),
        started=bool(configured),
        died=died,
        log_tail=started.log.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace"),
    )


def _events(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            break  # the last line of a run killed while writing it
    return found


def merge(events: list[dict], status: int | None) -> tuple[dict[str, list], str | None]:
    """Each test's outcome from its setup/call/teardown reports: [outcome, seconds, message]; and, when the run
    died inside a test, which one (that test is then an error)."""
    tests: dict[str, list] = {}
    running: str | None = None
    for event in events:
        if event["event"] == "start":
            running = event["id"]
        elif event["event"] == "report":
            entry = tests.setdefault(event["id"], [None, 0.0, ""])
            entry[1] = round(entry[1] + event["duration"], 4)
            _apply(entry, event)
            if event["when"] == "teardown" and running == event["id"]:
                running = None
    died = None
    if running is not None and not any(e["event"] == "finished" for e in events):
        died = f"died in {running} ({'killed: timed out' if status is None else f'exit {status}'})"
        entry = tests.setdefault(running, [None, 0.0, ""])
        entry[0], entry[2] = "error", f"the run died here ({died})"
    for entry in tests.values():
        if entry[0] is None:
            entry[0], entry[2] = "error", entry[2] or "no outcome reported"
    return tests, died


def _apply(entry: list, event: dict) -> None:
    when, outcome, message = event["when"], event["outcome"], event["message"]
    if when == "setup":
        if outcome == "failed":
            entry[0], entry[2] = "error", f"setup: {message}"
        elif outcome == "skipped":
            entry[0], entry[2] = ("xfailed" if event["xfail"] else "skipped"), message
    elif when == "call":
        if outcome == "passed":
            entry[0] = "xpassed" if event["xfail"] else "passed"
        elif outcome == "failed":
            entry[0], entry[2] = "failed", message
        else:
            entry[0], entry[2] = ("xfailed" if event["xfail"] else "skipped"), message
    elif outcome == "failed" and entry[0] not in FAIL:
        entry[0], entry[2] = "error", f"teardown: {message}"

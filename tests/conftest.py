"""Session fixtures: each expensive thing the suite needs is made once per run and shared (docs/testing.md says how
to use them). The helpers behind them are in tests/lib/.

- `vllm_history`: the real vLLM history (examples/vllm/make_upstream.py), {"path", "refs"}; read it, never write it.
- `fixed_wheels`: examples/vllm's two fixed wheels and the carry cache they were built in (lib.vllm.FixedWheels);
  take `fixed_wheels.cache_copy(dest)` (hard links) as your CARRY_CACHE to have them reused.
- `locked_vllm`, `cold_vllm`: examples/vllm locked and its image pushed cold, both platforms (lib.lockedvllm); a test
  that changes the project or the pushed tags is marked `late`, so that it runs after every reader. Their users run
  one after another and the image is removed when the last ends (`RELEASED_EARLY`).
- `installed_carry`: carry's wheel installed into a fresh venv (lib.installed.Installed).
- `second_engine`: a second, empty dockerd with the four base images (tests/secondengine.py); call `.empty()` first.

With pytest-xdist, a session fixture runs once per worker: the ones made on disk go through lib.shared.once (one
worker makes, the others wait and read), and every test that pushes to the registry, uses the
second engine, or times what it runs is in one worker group (`SERIAL_MODULES`, for `--dist loadgroup`).

No test writes into the user's carry cache: CARRY_CACHE defaults to a directory of this run (a test sets its own as
before), CARRY_DOWNLOADS to the machine's download store (the real releases are downloaded once per machine). A test
may add to that store, never take from it: the run fails naming what went (pytest_sessionfinish).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lib import shared

# xdist groups (--dist loadgroup): every test of these modules runs in one worker, one after another: what pushes to
# the registry (a removed repository's blobs are deleted: a push beside it could lose one), uses the second engine,
# holds the disk peak of the vLLM image, or compares the times of what it runs (test_verify_vllm,
# test_verify_locked). Every other test may run beside them, Docker builds and runs included (the engine takes them
# side by side; no test prunes the main engine).
SERIAL = "engine"
SERIAL_MODULES = {
    "test_engine_keep",
    "test_fresh_runner",
    "test_faults_layers",
    "test_faults_registry",
    "test_image",
    "test_image_cache",
    "test_locked_image",
    "test_registry",
    "test_runtime_base",
    "test_secrets",
    "test_trust_cosign",
    "test_verify_locked",
    "test_verify_vllm",
}


# `slow` (left out of the developers' fast loop, `-m "not slow"`): every test that uses one of these fixtures builds
# or installs something real (minutes), besides the tests marked slow by hand.
SLOW_FIXTURES = {"vllm_history", "fixed_wheels", "locked_vllm", "cold_vllm", "installed_carry", "second_engine"}
# Session fixtures of gigabytes released as soon as their last user ends, not at the session's end: the cold vLLM image
# in the registry and in the engine (about 21 GB; docs/testing.md: "The disk each heavy fixture holds"). Its users
# run at the end of the engine group; the modules of the largest temp dirs are groups of their own (HEAVY_GROUPS, and
# test_suite_vllm by its own mark), which xdist gives the other worker first (`--dist loadgroup` sends the groups of
# more tests first), so the two do not meet.
HEAVY_GROUPS = ("test_nightly_pin", "test_precompiled")
RELEASED_EARLY = {"vllm_registry"}
_RELEASE: dict[str, Callable[[], None]] = {}  # name -> how to release it, set by the fixture
_RAN_DOCKER: list[str] = []  # the engine tests that ran (the controller's view: xdist or not)
SLOW_MODULE_FIXTURES = {
    "test_buildenv": {"vllm_env"},  # vLLM's real build environment: PyPI's CUDA torch from uv's cache
    "test_lock": {"project"},  # resolves with uv against the runtime bases, both platforms
    "test_verify_locked": {"setup"},  # builds and pushes locked images for both platforms
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__ if item.module else ""
        names = set(getattr(item, "fixturenames", ()))
        if names & (SLOW_FIXTURES | SLOW_MODULE_FIXTURES.get(module, set())) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if module in SERIAL_MODULES and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(SERIAL))
        elif module in HEAVY_GROUPS and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(module))
    # the users of a fixture released early run last in their group, one after another (its `late` ones last): the
    # other worker has then ended the groups of big temp dirs (xdist sends the larger groups first: HEAVY_GROUPS)
    for name in RELEASED_EARLY:
        users = [item for item in items if name in getattr(item, "fixturenames", ())]
        stray = [item.nodeid for item in users if item.module and item.module.__name__ not in SERIAL_MODULES]
        if stray:  # another worker could still be reading what this one removes
            raise pytest.UsageError(f"{stray[0]} uses {name}, released early: put its module in SERIAL_MODULES")
        items[:] = [item for item in items if name not in getattr(item, "fixturenames", ())] + sorted(users, key=_late)
    # any other test marked `late` changes a shared session thing: after every other test (stable: the order stays)
    items.sort(key=lambda item: _late(item) and not RELEASED_EARLY & set(getattr(item, "fixturenames", ())))


def _late(item) -> bool:
    return item.get_closest_marker("late") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A fixture of RELEASED_EARLY is released once its last user (they run one after another) has ended."""
    yield
    for name in RELEASED_EARLY & set(getattr(item, "fixturenames", ())):
        if (nextitem is None or name not in nextitem.fixturenames) and name in _RELEASE:
            _RELEASE.pop(name)()


@pytest.fixture(scope="session", autouse=True)
def _carry_cache_of_this_run(tmp_path_factory):
    """CARRY_CACHE: this run's own unless set; CARRY_DOWNLOADS: the machine's store unless set."""
    saved = {key: os.environ.get(key) for key in ("CARRY_CACHE", "CARRY_DOWNLOADS")}
    if not saved["CARRY_DOWNLOADS"]:
        users = Path(saved["CARRY_CACHE"] or Path.home() / ".cache" / "carry")
        os.environ["CARRY_DOWNLOADS"] = str(users / "downloads")
    if not saved["CARRY_CACHE"]:
        root = shared.run_root(tmp_path_factory) / "carry-cache"
        root.mkdir(exist_ok=True)
        os.environ["CARRY_CACHE"] = str(root)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def vllm_history(tmp_path_factory) -> dict:
    from lib import vllm

    return shared.once(tmp_path_factory, "vllm-history", vllm.make_history)


@pytest.fixture(scope="session")
def fixed_wheels(tmp_path_factory, vllm_history):
    from lib import vllm

    found = shared.once(
        tmp_path_factory, "vllm-fixed-wheels", lambda d: vllm.make_fixed_wheels(d, vllm_history["path"])
    )
    return vllm.FixedWheels.from_json(found)


@pytest.fixture(scope="session")
def vllm_services():
    import dockerenv

    return dockerenv.require()


@pytest.fixture(scope="session")
def vllm_registry(vllm_services):
    from lib.lockedvllm import Registry

    found = Registry(vllm_services)
    _RELEASE["vllm_registry"] = found.remove
    yield found
    found.remove()


@pytest.fixture(scope="session")
def locked_vllm(tmp_path_factory, vllm_services, vllm_registry, vllm_history, fixed_wheels):
    """(config, env, name, root) of examples/vllm locked, its image section pushing to the test registry."""
    from lib import lockedvllm

    root = tmp_path_factory.mktemp("locked")
    return lockedvllm.locked_project(root, vllm_services, vllm_registry, vllm_history["path"], fixed_wheels)


@pytest.fixture(scope="session")
def cold_vllm(locked_vllm):
    """(the JSON `image --push` printed, its Result): both platforms pushed cold and smoke-tested."""
    from lib import lockedvllm

    return lockedvllm.cold(locked_vllm)


@pytest.fixture(scope="session")
def installed_carry(tmp_path_factory):
    from lib import installed

    found = shared.once(tmp_path_factory, "installed-carry", lambda d: installed.install(d).to_json())
    return installed.Installed.from_json(found)


@pytest.fixture(scope="session")
def second_engine():
    """A second dockerd with only the four base images (empty it before use: `second_engine.empty()`)."""
    import dockerenv
    import secondengine

    env = dockerenv.require()
    problem = secondengine.problem()
    if problem:
        pytest.fail(problem) if dockerenv.in_ci() else pytest.skip(problem)
    bases = (env.build_base, env.runtime_base, env.build_base_arm64, env.runtime_base_arm64)
    with secondengine.started(bases, env.docker_host) as engine:
        yield engine


# Seconds per module (setups, calls and teardowns of its tests), printed after the slowest tests: what each module
# costs against its budget (docs/testing.md). Under pytest-xdist the reports reach the controller, which prints it.
_MODULE_SECONDS: dict[str, float] = {}
_SETUP_SECONDS: list[tuple[float, str]] = []  # (seconds, test) of every setup: its 10 slowest printed before it
# Per xdist worker: the seconds its tests took and when its last one ended (since the session started): the run's
# wall time is the later of the two ends, and a gap between them is work one worker could have taken from the other
_WORKER: dict[str, list[float]] = {}
_STARTED: list[float] = []
_STORE_BEFORE: dict[str, set[str]] = {}
# The checkout's dist/, where a test's `carry` run without its own cwd or --out writes (`image` has no --out): what the
# run made there is removed at its end
CHECKOUT_DIST = Path(__file__).resolve().parent.parent / "dist"
_DIST_BEFORE: dict[str, set[str] | None] = {}


def _machine_store() -> Path:
    """The store _carry_cache_of_this_run gives the tests: $CARRY_DOWNLOADS, else the user's cache's."""
    users = Path(os.environ.get("CARRY_CACHE") or Path.home() / ".cache" / "carry")
    return Path(os.environ.get("CARRY_DOWNLOADS") or users / "downloads")


def pytest_sessionstart(session):
    """What the machine's download store and the checkout's dist/ hold when the run starts (the controller's view:
    xdist or not)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _STARTED.append(time.monotonic())
    _DIST_BEFORE["names"] = {p.name for p in CHECKOUT_DIST.glob("*")} if CHECKOUT_DIST.is_dir() else None
    store = _machine_store()
    _STORE_BEFORE["files"] = {str(p.relative_to(store)) for p in store.glob("*/*")} if store.is_dir() else set()


def pytest_sessionfinish(session, exitstatus):
    """A test may add to the machine's download store, never take from it: the run fails, naming what went. The
    Python bases carry derived from the test bases (its engine-side cache) go with the run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _RAN_DOCKER:  # a run of no engine test (a second pytest beside CI's) leaves the engine's bases to their run
        _remove_derived_test_bases()
    if "names" in _DIST_BEFORE:
        _remove_what_the_run_made_in_dist(_DIST_BEFORE["names"])
    if "files" not in _STORE_BEFORE:
        return
    store = _machine_store()
    gone = sorted(f for f in _STORE_BEFORE["files"] if not (store / f).exists())
    if gone:
        print(
            f"\nconftest: {len(gone)} file(s) of the machine's download store {store} were removed by the run: "
            + ", ".join(gone[:10])
            + (" …" if len(gone) > 10 else "")
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _remove_what_the_run_made_in_dist(before: set[str] | None) -> None:
    """The entries of the checkout's dist/ that were not there when the run started (and dist/ if it was not)."""
    for made in [p for p in CHECKOUT_DIST.glob("*") if p.name not in (before or set())]:
        if made.is_dir() and not made.is_symlink():
            shutil.rmtree(made, ignore_errors=True)
        else:
            made.unlink(missing_ok=True)
    if before is None:
        with contextlib.suppress(OSError):  # gone already, or something else writes there now
            CHECKOUT_DIST.rmdir()


def _remove_derived_test_bases() -> None:
    """carry-derived/python images whose base is a `carry-test/` image (a user's own derived bases stay)."""
    import docker

    import dockerenv
    from carry.image.locked import runtimebase

    try:
        client = dockerenv.docker_client()
        derived = client.images.list(name=runtimebase.DERIVED_REPO)
    except (docker.errors.DockerException, OSError):  # no engine in this run: nothing was derived
        return
    for image in derived:
        if (image.labels or {}).get(runtimebase.LABEL_BASE_NAME, "").startswith("carry-test/"):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(image.id, force=True)


def pytest_runtest_logreport(report):
    if "docker" in report.keywords:
        _RAN_DOCKER.append(report.nodeid)
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + getattr(report, "duration", 0.0)
    node = getattr(report, "node", None)  # pytest-xdist's controller: the worker that ran it
    busy = _WORKER.setdefault(node.gateway.id if node else "main", [0.0, 0.0])
    busy[0] += getattr(report, "duration", 0.0)
    busy[1] = time.monotonic() - (_STARTED or [time.monotonic()])[0]
    if report.when == "setup":
        _SETUP_SECONDS.append((getattr(report, "duration", 0.0), report.nodeid))


@pytest.hookimpl(trylast=True)  # after the slowest tests
def pytest_terminal_summary(terminalreporter, config):
    if os.environ.get("PYTEST_XDIST_WORKER") or not _MODULE_SECONDS:
        return
    terminalreporter.write_sep("=", "10 slowest setups")
    for seconds, test in heapq.nlargest(10, _SETUP_SECONDS):
        terminalreporter.write_line(f"{seconds:8.1f}s {test}")
    terminalreporter.write_sep("=", "seconds per module (budgets: docs/testing.md)")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda pair: -pair[1]):
        if seconds >= 1:
            terminalreporter.write_line(f"{seconds:8.1f}s {module}")
    terminalreporter.write_sep("=", "seconds per worker")
    for worker, (busy, ended) in sorted(_WORKER.items()):
        terminalreporter.write_line(f"{busy:8.1f}s {worker}: its tests; its last ended {ended:.0f} s into the run")

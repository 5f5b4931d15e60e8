"""Crash safety: SIGKILL carry (and every child: git, pip, nvcc, docker) at seeded random points, then rerun.

Kill points come from `random.Random` seeded with SEED and the test's name, drawn within the command's
measured duration: uniformly over the whole run for `fetch` and `check`, and for `wheel` and `image` at a
random offset into a randomly chosen phase (carry prints each phase as it starts), so short phases such as
materializing the tree or stamping the wheel get hit too. After every kill and after every rerun:
`dist/` holds only wheels that `build.py verify` accepts (temp files stay hidden and are never *.whl), each
cached artifact is one verifiable wheel (with its sha256 recorded beside it, when there is one, its own), the mirror
passes `git fsck`, the cached bundle verifies, and the rerun without a kill succeeds. CARRY_CRASH_SEED picks another
sequence; CARRY_CRASH_ROUNDS multiplies the number of kills for a longer soak.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import dockerenv
from helpers import BUILD_PY, ROOT, carry

SEED = int(os.environ.get("CARRY_CRASH_SEED", "20261129"))
ROUNDS = int(os.environ.get("CARRY_CRASH_ROUNDS", "1"))
KILLS = {"fetch": 7, "check": 6, "wheel": 6, "image": 2}
ARCHES = "9.0,12.1"
PIN_REF = "refs/carry/pin"
PHASE_RE = re.compile(r"^\[\s*[0-9.]+s\] ([a-z-]+):")
START = "start"


@dataclasses.dataclass(frozen=True)
class KillPoint:
    """SIGKILL `delay` seconds after carry prints `phase` (START: after it was started)."""

    phase: str
    delay: float

    def __str__(self) -> str:
        return f"{self.delay:.2f}s into {self.phase}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    killed: bool
    phases: dict[str, float]
    total: float
    stderr: str

    def spans(self) -> list[tuple[str, float]]:
        """(phase, length) for START and every phase printed, in order."""
        starts = [(START, 0.0), *sorted(self.phases.items(), key=lambda item: item[1])]
        ends = [t for _, t in starts[1:]] + [self.total]
        return [(name, max(end - begin, 0.01)) for (name, begin), end in zip(starts, ends)]


@dataclasses.dataclass
class Demo:
    """A copy of examples/demo with its own cache and dist."""

    root: Path
    env: dict[str, str]

    @property
    def project(self) -> Path:
        return self.root / "demo"

    @property
    def config(self) -> Path:
        return self.project / "build.yaml"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    def run(self, *command: str):
        return carry("--config", str(self.config), *command, env=self.env)


@dataclasses.dataclass
class Tally:
    """What one command's kill loop did."""

    command: str
    killed: int = 0
    finished_first: int = 0
    points: list[str] = dataclasses.field(default_factory=list)

    def line(self, duration: float) -> str:
        return (
            f"crash {self.command}: {self.killed} kill(s) survived, {self.finished_first} run(s) finished "
            f"before the kill; measured {duration:.2f}s; kills at: {'; '.join(self.points)}"
        )


def make_demo(base: Path) -> Demo:
    shutil.copytree(ROOT / "examples" / "demo", base / "demo")
    (base / "demo" / "VERSION").write_text("20261101.1\n")
    return Demo(base, {"CARRY_CACHE": str(base / "cache")})


def run_carry(demo: Demo, command: tuple[str, ...], kill: KillPoint | None = None) -> Outcome:
    """Run carry in its own session, noting when each phase starts; with `kill`, SIGKILL its whole process
    group (carry, git, pip, nvcc, docker) at that point unless it exited first."""
    proc = subprocess.Popen(
        [sys.executable, str(BUILD_PY), "--config", str(demo.config), *command],
        env={**os.environ, **demo.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    began = time.monotonic()
    phases: dict[str, float] = {}
    lines: list[str] = []
    reached = threading.Event()
    if kill is None or kill.phase == START:
        reached.set()

    def read() -> None:
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            lines.append(line)
            match = PHASE_RE.match(line)
            if match:
                phases.setdefault(match.group(1), time.monotonic() - began)
                if kill is not None and match.group(1) == kill.phase:
                    reached.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed = False
    if kill is None:
        proc.wait()
    else:
        while not reached.wait(0.005) and proc.poll() is None:
            pass
        try:
            proc.wait(timeout=kill.delay)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            killed = True
    total = time.monotonic() - began
    reader.join(timeout=30)
    outcome = Outcome(killed, phases, total, "".join(lines))
    if kill is None:
        assert proc.returncode == 0, outcome.stderr
    return outcome


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL carry's process group (its session leader is carry) and wait until no member is left."""
    group = proc.pid
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 10
    while _group_members(group) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _group_members(group), "a child of the killed carry survived"


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def mirrors(demo: Demo) -> list[Path]:
    root = demo.cache / "mirrors"
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def assert_consistent(demo: Demo, when: str) -> None:
    """What must hold at every moment: right after a kill as much as after a clean run."""
    for mirror in mirrors(demo):
        fsck = subprocess.run(["git", "fsck", "--no-progress"], cwd=mirror, capture_output=True, text=True)
        assert fsck.returncode == 0, f"{when}: git fsck failed in {mirror}:\n{fsck.stdout}{fsck.stderr}"
    bundles = sorted((demo.cache / "bundles").glob("*.bundle"))
    for bundle in bundles:
        verified = subprocess.run(
            ["git", "bundle", "verify", "--quiet", str(bundle)], cwd=mirrors(demo)[0], capture_output=True, text=True
        )
        assert verified.returncode == 0, f"{when}: {bundle} does not verify: {verified.stderr}"
    assert_only_verifiable_wheels(demo, demo.dist, when)
    artifacts = demo.cache / "artifacts"
    for entry in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
        if not entry.name.startswith("."):
            assert len(list(entry.glob("*.whl"))) == 1, f"{when}: cached artifact {entry} holds {list(entry.iterdir())}"
            assert_only_verifiable_wheels(demo, entry, when)


def assert_only_verifiable_wheels(demo: Demo, directory: Path, when: str) -> None:
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        if entry.name.startswith("."):
            assert entry.name.endswith(".tmp"), f"{when}: unexpected hidden {entry}"
            continue
        if entry.name.endswith(".whl.gate.txt"):  # a wheel's gate report: never without its wheel
            assert entry.with_name(entry.name.removesuffix(".gate.txt")).is_file(), f"{when}: {entry} has no wheel"
            assert entry.read_text().startswith("arch gate passed"), f"{when}: {entry} is not a full report"
            continue
        if entry.name.endswith(".whl.sha256"):  # a cached wheel's sha256, recorded when it was stored: its wheel's
            wheel = entry.with_name(entry.name.removesuffix(".sha256"))
            assert wheel.is_file(), f"{when}: {entry} has no wheel"
            recorded = entry.read_text().split()[0]
            assert recorded == hashlib.sha256(wheel.read_bytes()).hexdigest(), f"{when}: {entry} is not its wheel's"
            continue
        assert entry.name.endswith(".whl"), f"{when}: unexpected {entry} in {directory}"
        verified = demo.run("verify", str(entry))
        assert verified.code == 0, f"{when}: {entry} does not verify:\n{verified.out}{verified.err}"


def kill_loop(
    demo: Demo,
    command: tuple[str, ...],
    wanted: int,
    draw: Callable[[], KillPoint],
    before_each: Callable[[], None] = lambda: None,
    after_rerun: Callable[[str], None] = lambda out: None,
) -> Tally:
    """Kill `command` at drawn points until `wanted` kills landed; after each, check, rerun, check again."""
    tally = Tally(command[0])
    for _ in range(wanted * 3):
        if tally.killed == wanted:
            break
        before_each()
        point = draw()
        if run_carry(demo, command, point).killed:
            tally.killed += 1
            tally.points.append(str(point))
        else:
            tally.finished_first += 1
        assert_consistent(demo, f"{command[0]} killed {point}")
        rerun = demo.run(*command)
        assert rerun.code == 0, f"rerun after a kill {point} failed:\n{rerun.out}{rerun.err}"
        after_rerun(rerun.out)
        assert_consistent(demo, f"rerun after {command[0]} killed {point}")
    assert tally.killed == wanted, tally
    return tally


def uniform(rng: random.Random, duration: float) -> Callable[[], KillPoint]:
    return lambda: KillPoint(START, rng.uniform(0.02, duration))


def in_a_phase(
    rng: random.Random, reference: Outcome, phases: tuple[str, ...] | None = None
) -> Callable[[], KillPoint]:
    """A random offset into a random phase; with no phases named, half the draws are uniform over the run
    instead, so long phases (the compile) get their share too."""
    spans = [(name, length) for name, length in reference.spans() if phases is None or name in phases]
    assert spans, reference.stderr

    def draw() -> KillPoint:
        if phases is None and rng.random() < 0.5:
            return KillPoint(START, rng.uniform(0.02, reference.total))
        name, length = rng.choice(spans)
        return KillPoint(name, rng.uniform(0.0, length))

    return draw


@pytest.fixture
def rng(request) -> random.Random:
    """One seeded sequence per test, so a test run alone draws the same points."""
    return random.Random(f"{SEED}-{request.node.name}")


@pytest.mark.slow  # kills at many points of a real run
def test_fetch_survives_sigkill(tmp_path, rng):
    """Every kill hits a cold fetch: init of the mirror, the shallow fetch, the bundle, the PR head."""
    demo = make_demo(tmp_path)
    duration = run_carry(demo, ("fetch",)).total
    cold = lambda: shutil.rmtree(demo.cache, ignore_errors=True)  # noqa: E731
    tally = kill_loop(demo, ("fetch",), KILLS["fetch"] * ROUNDS, uniform(rng, duration), cold)
    pin = demo.config.read_text().split("commit: ", 1)[1].split()[0]
    (mirror,) = mirrors(demo)
    pinned = subprocess.run(["git", "rev-parse", PIN_REF], cwd=mirror, capture_output=True, text=True)
    assert pinned.stdout.strip() == pin
    print(tally.line(duration))


@pytest.mark.slow  # kills at many points of a real run
def test_check_survives_sigkill(tmp_path, rng):
    """Kills alternate between a cold cache (check fetches first) and a warm one."""
    demo = make_demo(tmp_path)
    duration = run_carry(demo, ("check",)).total
    warm = run_carry(demo, ("check",)).total
    reference = demo.run("check", "--json").out
    turns = iter(range(10**6))

    def every_other_cold() -> None:
        if next(turns) % 2 == 0:
            shutil.rmtree(demo.cache, ignore_errors=True)

    def draw() -> KillPoint:  # a point inside the run that follows: a warm check is over in a fraction of a cold one
        return KillPoint(START, rng.uniform(0.02, warm if demo.cache.exists() else duration))

    tally = kill_loop(demo, ("check",), KILLS["check"] * ROUNDS, draw, every_other_cold)
    assert demo.run("check", "--json").out == reference
    print(tally.line(duration))


@pytest.mark.slow
def test_wheel_survives_sigkill(tmp_path, rng):
    """The build dir, compiler cache and dist persist across kills; the finished artifact is dropped before
    each killed run, so every one of them really builds."""
    demo = make_demo(tmp_path)
    command = ("wheel", "--arch", ARCHES, "--out", str(demo.dist))
    run_carry(demo, command)
    drop_artifacts = lambda: shutil.rmtree(demo.cache / "artifacts", ignore_errors=True)  # noqa: E731
    drop_artifacts()
    reference = run_carry(demo, command)
    assert {"materialize", "build", "gate", "stamp"} <= reference.phases.keys(), reference.stderr
    tally = kill_loop(demo, command, KILLS["wheel"] * ROUNDS, in_a_phase(rng, reference), drop_artifacts)
    wheels = sorted(demo.dist.glob("*.whl"))
    assert len(wheels) == 1 and "+carry.20261101.1" in wheels[0].name
    print(tally.line(reference.total))


@pytest.mark.slow
@pytest.mark.docker
def test_image_survives_sigkill_during_docker_build(tmp_path, rng):
    """Kill while `docker build` runs, then rebuild and verify the image."""
    env = dockerenv.require()
    demo = make_demo(tmp_path)
    name = f"carry-crash-{os.urandom(3).hex()}"
    dockerenv.set_image_section(demo.config, env.image_section(name))
    demo.env.update(CARRY_DOCKER=dockerenv.DOCKER_CLI, DOCKER_HOST=env.docker_host)
    command = ("image", "--hermetic", "--arch", ARCHES)
    client = dockerenv.docker_client()
    numbers = iter(range(2, 10**6))
    version = {}

    def new_version() -> None:
        """A new VERSION changes the build context, so the killed build really runs its RUN step."""
        version["now"] = f"20261101.{next(numbers)}"
        (demo.project / "VERSION").write_text(f"{version['now']}\n")

    def image_verifies(out: str) -> None:
        ref = f"{name}:{version['now']}"
        assert ref in out.split(), out
        verified = demo.run("verify", ref, "--local")  # built, never pushed: this engine's image
        assert verified.code == 0, verified.out + verified.err

    try:
        reference = run_carry(demo, command)
        draw = in_a_phase(rng, reference, ("build",))
        tally = kill_loop(demo, command, KILLS["image"] * ROUNDS, draw, new_version, image_verifies)
        print(tally.line(dict(reference.spans())["build"]))
    finally:
        for image in client.images.list(name=name):
            client.images.remove(image.id, force=True)


def test_kill_while_git_holds_a_ref_lock(tmp_path):
    """A deterministic kill inside git's ref transaction: git's reference-transaction hook runs while the
    ref locks are held, so a hook that waits keeps `refs/carry/pin.lock` in place for the kill."""
    demo = make_demo(tmp_path)
    assert demo.run("fetch").code == 0
    (mirror,) = mirrors(demo)
    marker = tmp_path / "in-transaction"
    hook = mirror / "hooks" / "reference-transaction"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f'#!/bin/sh\nif [ "$1" = prepared ]; then touch {marker}; sleep 60; fi\ncat >/dev/null\n')
    hook.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, str(BUILD_PY), "--config", str(demo.config), "fetch"],
        env={**os.environ, **demo.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "git never entered the ref transaction"
        time.sleep(0.01)
    kill_group(proc)
    hook.unlink()
    stale = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*.lock"))
    assert stale, "the kill should have left git's ref lock behind"
    rerun = demo.run("fetch")
    assert rerun.code == 0, rerun.err
    assert_consistent(demo, "rerun after a kill inside a ref transaction")
    assert not list(mirror.rglob("*.lock"))


def test_leftovers_of_a_killed_process_are_swept_by_the_next_run(tmp_path):
    """A scratch dir (which may hold secret.env) and a dist temp file of a killed carry are removed next time."""
    script = (
        "import os, sys, time, tempfile\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from carry.util.fsutil import temp_dir, owned_prefix\n"
        "parent = Path(sys.argv[1])\n"
        "tempfile.mkstemp(prefix=owned_prefix('.demo.whl.'), suffix='.tmp', dir=parent)\n"
        "with temp_dir(parent, 'image-') as scratch:\n"
        "    (scratch / 'secret.env').write_text('TOKEN=x')\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    child.kill()
    child.wait()
    assert list(tmp_path.glob("image-*/secret.env")) and list(tmp_path.glob(".demo.whl.*.tmp"))
    from carry.util.fsutil import sweep_dead, temp_dir

    with temp_dir(tmp_path, "image-"):
        pass
    sweep_dead(tmp_path, ".demo.whl.")
    assert list(tmp_path.iterdir()) == []

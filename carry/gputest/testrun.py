"""Run build.tests against a built artifact on this machine's GPU, and record the result beside it.

A wheel is installed alone (no dependencies, no index) into a fresh venv whose own site-packages come first, with the
running Python's site-packages behind it (also when carry runs in a venv): tests find what the wheel needs, e.g.
torch, while the wheel shadows any other install of it. Each command runs with that venv first on PATH, in an empty
directory, never through a shell; an image runs each with `docker run --rm --gpus all`. The report names the artifact
by sha256 (`<wheel>.test.json` beside the wheel) or image ID (`image-sha256-<hex>.test.json`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import json
import os
import platform
import shlex
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import carry
from carry.binaries import buildinfo
from carry.config import Config
from carry.config.build import TestCommand
from carry.gputest.gpu import Gpu
from carry.gputest.reportcheck import ReportCheck, read_json
from carry.util import reporter
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.util.integrity import file_sha256
from carry.util.run import NETWORK_S, PROBE_S, execute

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from carry.util.cache import Cache
    from carry.wheelbuild.verify import Verification

FORMAT = 1
SUFFIX = ".test.json"
OUTPUT_TAIL_CHARS = 4000
RUNTIME_ARGS_LABEL = "io.carry.runtime.docker-args"
IMAGE_PROJECT = "/carry/project"  # where `test IMAGE` mounts the project's directory (read-only)
VENV_S = 300  # a venv without pip
INSTALL_S = 1800  # pip installs the one wheel from its file (vLLM's is 400 MB)


class ArtifactKind(enum.Enum):
    WHEEL = "wheel"
    IMAGE = "image"

    @classmethod
    def parse(cls, text: object, where: str) -> ArtifactKind:
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(kind.value for kind in cls)
            raise Failed(
                f"{where}: artifact kind {text!r} is not one of {allowed}; it is not a carry test report"
            ) from None


@dataclasses.dataclass(frozen=True)
class Artifact:
    """What was tested: a wheel file (name, sha256 of its bytes) or an image (the ref given, its image ID)."""

    kind: ArtifactKind
    name: str
    digest: str

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "name": self.name, "digest": self.digest}


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """One command's outcome; `exit_status` is None when it ran past the timeout and was killed."""

    command: str
    exit_status: int | None
    duration_s: float
    output_tail: str

    @property
    def passed(self) -> bool:
        return self.exit_status == 0

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def outcome(self) -> str:
        return "timed out" if self.exit_status is None else f"exit {self.exit_status}"

    def last_line(self) -> str:
        lines = [line for line in self.output_tail.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""

    def to_json(self) -> dict:
        return {
            "command": self.command,
            "exit_status": self.exit_status,
            "passed": self.passed,
            "duration_s": round(self.duration_s, 3),
            "output_tail": self.output_tail,
        }


@dataclasses.dataclass(frozen=True)
class TestReport:
    """The record written beside the artifact."""

    __test__ = False  # not a pytest class
    artifact: Artifact
    gpu: Gpu
    python: str
    started: str
    duration_s: float
    buildinfo: dict | None
    results: tuple[CommandResult, ...]

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(result.passed for result in self.results)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "carry": carry.__version__,
            "artifact": self.artifact.to_json(),
            "gpu": self.gpu.to_json(),
            "python": self.python,
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "passed": self.passed,
            "buildinfo": self.buildinfo,
            "tests": [result.to_json() for result in self.results],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> TestReport:
        """Read a report back; Failed, naming the field, when it is not one carry wrote."""
        try:
            if data.get("format") != FORMAT:
                raise Failed(f"{where}: report format {data.get('format')!r}, this carry reads {FORMAT}")
            artifact, gpu = data["artifact"], data["gpu"]
            kind = ArtifactKind.parse(artifact["kind"], where)
            return cls(
                artifact=Artifact(kind, str(artifact["name"]), str(artifact["digest"])),
                gpu=Gpu(str(gpu["name"]), str(gpu["capability"]), str(gpu["driver"]), int(gpu["count"])),
                python=str(data["python"]),
                started=str(data["started"]),
                duration_s=float(data["duration_s"]),
                buildinfo=data.get("buildinfo"),
                results=tuple(
                    CommandResult(str(t["command"]), t["exit_status"], float(t["duration_s"]), str(t["output_tail"]))
                    for t in data["tests"]
                ),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise Failed(f"{where}: not a carry test report ({type(exc).__name__}: {exc})") from None


def wheel_report_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + SUFFIX)


def image_report_path(out: Path, image_id: str) -> Path:
    return out / f"image-{image_id.replace(':', '-')}{SUFFIX}"


def write(report: TestReport, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(report.to_json(), indent=2) + "\n")
    return path


def _provenance(wheel: Path) -> dict | None:
    """The parts of the wheel's buildinfo that say what it was built from, when carry built it."""
    info = buildinfo.read(wheel)
    if info is None:
        return None
    series = info.get("series", {})
    return {
        "version": info.get("version"),
        "upstream_commit": info.get("upstream", {}).get("commit"),
        "series_hash": series.get("hash"),
        "patches": [patch.get("name") for patch in series.get("patches", [])],
        "tree": info.get("tree"),
    }


def run_on_wheel(
    wheel: Path,
    commands: tuple[TestCommand, ...],
    gpu: Gpu,
    scratch: Path,
    timeout: float,
    tree: Path | None = None,
    project: Path | None = None,
) -> TestReport:
    """Install `wheel` into a fresh venv and run every command there; a command that runs against the source tree
    (`against: tree`) runs in `tree` instead, a checkout of the tree the wheel was built from (see run_in_tree)."""
    if not wheel.is_file() or not wheel.name.endswith(".whl"):
        raise BadInput(f"{wheel}: not a wheel file; pass the .whl that `wheel` printed")
    artifact = Artifact(ArtifactKind.WHEEL, wheel.name, f"sha256:{file_sha256(wheel)}")
    provenance = _provenance(wheel)
    started, clock = _now(), time.monotonic()
    with temp_dir(scratch, "test-") as work:
        venv = _make_venv(work / "venv")
        _install(venv, wheel)
        env = {**_plain_env(venv / "bin"), "VIRTUAL_ENV": str(venv)}
        results = tuple(_run_one(command, env, work, tree, project, timeout) for command in commands)
    return TestReport(artifact, gpu, platform.python_version(), started, time.monotonic() - clock, provenance, results)


def names_a_wheel(artifact: str) -> bool:
    """A wheel file (an existing file or a *.whl path) rather than an image reference."""
    return artifact.endswith(".whl") or Path(artifact).is_file()


def run_artifact(
    artifact: str, config: Config, commands: tuple[TestCommand, ...], gpu: Gpu, scratch: Path, out: Path, timeout: float
) -> tuple[TestReport, Path]:
    """Run commands against a wheel (fresh venv) or an image (docker run --gpus all, with the config's docker); the
    report (returned with where it went) is written beside the wheel, or into `out` keyed by the image's ID."""
    if names_a_wheel(artifact):
        wheel = Path(artifact)
        report = run_on_wheel(wheel, commands, gpu, scratch, timeout, project=config.root)
        return report, write(report, wheel_report_path(wheel))
    from carry.image.buildkit import container

    report = run_on_image(artifact, commands, gpu, container.docker_binary(config), scratch, timeout, config.root)
    return report, write(report, image_report_path(out, report.artifact.digest))


def run_in_tree(
    tree: Path | None, commands: tuple[TestCommand, ...], scratch: Path, timeout: float, project: Path | None = None
) -> tuple[CommandResult, ...]:
    """Run commands that read the upstream's sources in the checkout `tree`, with no wheel and no PYTHONPATH; `{tree}`
    and `{project}` (build.yaml's directory) in their arguments, and CARRY_TREE and CARRY_PROJECT, name those."""
    with temp_dir(scratch, "test-") as work:
        return tuple(_run_one(command, _plain_env(), work, tree, project, timeout) for command in commands)


@contextlib.contextmanager
def tree_checkout(cache: Cache, mirror: Path, tree: str | None, wanted: bool) -> Iterator[Path | None]:
    """A checkout of `tree` for commands that run in the source tree, in a stable directory of the cache (held
    under its lock; only changed files are rewritten), or None when not `wanted` or there is no tree."""
    if not wanted or tree is None:
        yield None
        return
    from carry.source import git

    where = cache.builds / f"tree-{mirror.name}"
    with cache.lock(where.name):
        git.checkout_tree(mirror, tree, None, where / "tree")
        yield where / "tree"


def _run_one(
    command: TestCommand, env: dict[str, str], work: Path, tree: Path | None, project: Path | None, timeout: float
) -> CommandResult:
    if not command.tree:  # `{project}`: the directory of build.yaml (a project's own test scripts live there)
        argv = [_fill(arg, {"{project}": str(project or work)}) for arg in command.argv]
        return _run(command, argv, env, work, timeout)
    if tree is None:
        return CommandResult(
            command.text, 127, 0.0, "carry: this command runs in the source tree, and none was checked out for it"
        )
    places = {"{tree}": str(tree), "{project}": str(project or tree)}
    argv = [_fill(arg, places) for arg in command.argv]
    env = {**_plain_env(), "CARRY_TREE": places["{tree}"], "CARRY_PROJECT": places["{project}"]}
    return _run(command, argv, env, work, timeout, cwd=tree)


def _fill(arg: str, places: dict[str, str]) -> str:
    for name, value in places.items():
        arg = arg.replace(name, value)
    return arg


def _plain_env(bindir: Path | None = None) -> dict[str, str]:
    """The caller's environment without PYTHONPATH, `bindir` first on PATH (by default the running Python's directory,
    so `python` is the Python running carry; a venv's bin/ for a wheel under test)."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(bindir or Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return env


def run_on_image(
    ref: str,
    commands: tuple[TestCommand, ...],
    gpu: Gpu,
    docker: str,
    scratch: Path,
    timeout: float,
    project: Path | None = None,
) -> TestReport:
    """Run every command in the image (`docker run --rm --gpus all` plus its runtime args label), its first word the
    entrypoint (an image's own would take it as arguments), build.yaml's directory read-only at IMAGE_PROJECT."""
    image_id, runtime_args = _inspect_image(docker, ref)
    if "--gpus" not in " ".join(runtime_args):
        runtime_args = ["--gpus", "all", *runtime_args]
    if project is not None:
        runtime_args += ["--volume", f"{project.resolve()}:{IMAGE_PROJECT}:ro"]
    artifact = Artifact(ArtifactKind.IMAGE, ref, image_id)
    started, clock = _now(), time.monotonic()
    results = []
    with temp_dir(scratch, "test-") as work:
        for command in commands:
            args = (_fill(arg, {"{project}": IMAGE_PROJECT}) for arg in command.argv[1:])
            argv = [docker, "run", "--rm", *runtime_args, "--entrypoint", command.argv[0], image_id, *args]
            results.append(_run(command, argv, dict(os.environ), work, timeout))
    return TestReport(artifact, gpu, "(in the image)", started, time.monotonic() - clock, None, tuple(results))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _make_venv(venv: Path) -> Path:
    """A venv with no packages of its own; the running Python's site-packages are added behind its own."""
    execute([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=VENV_S).check_returncode()
    parents = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    lines = [f"import site; site.addsitedir({path!r})\n" for path in parents if Path(path).is_dir()]
    (Path(purelib(venv / "bin" / "python")) / "_carry_parent_site.pth").write_text("".join(lines))
    return venv


def purelib(python: Path) -> str:
    """The site-packages directory of the interpreter `python`."""
    done = execute(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=PROBE_S, text=True
    )
    done.check_returncode()
    return str(done.stdout).strip()


def _install(venv: Path, wheel: Path) -> None:
    """pip (the running Python's, seen through the venv) installs the wheel alone into the venv."""
    flags = ["--no-deps", "--no-index", "--ignore-installed", "--no-compile", "--disable-pip-version-check", "--quiet"]
    command = [str(venv / "bin" / "python"), "-m", "pip", "install", *flags, str(wheel)]
    result = execute(command, text=True, timeout=INSTALL_S)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise Failed(
            f"installing {wheel.name} into a fresh venv failed (exit {result.returncode}): "
            f"{said[-1] if said else 'no output'}"
        )


def _run(
    command: TestCommand, argv: Sequence[str], env: dict[str, str], work: Path, timeout: float, cwd: Path | None = None
) -> CommandResult:
    """Run one command in a fresh empty directory (or `cwd`); its output goes to a file, its tail into the result."""
    index = len(list(work.glob("run-*")))
    run_dir, log = work / f"run-{index}", work / f"output-{index}.log"
    run_dir.mkdir()
    cwd = cwd or run_dir
    reporter.phase("test", command.text)
    executable = shutil.which(argv[0], path=env.get("PATH"))
    clock = time.monotonic()
    if executable is None:
        return CommandResult(command.text, 127, 0.0, f"carry: {argv[0]}: not found on PATH (the venv's bin first)")
    with open(log, "wb") as handle:
        try:
            status: int | None = execute(
                [executable, *argv[1:]], cwd=cwd, env=env, log=handle, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            status = None
    duration = time.monotonic() - clock
    output = log.read_bytes()[-OUTPUT_TAIL_CHARS:].decode(errors="replace")
    if status is None:
        output += f"\ncarry: killed after {timeout:g} s"
    return CommandResult(command.text, status, duration, output)


def _inspect_image(docker: str, ref: str) -> tuple[str, list[str]]:
    """The image's ID and the docker-run args its label asks for; pulled first when it is not here."""
    inspect = [docker, "image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", ref]
    result = execute(inspect, text=True, timeout=PROBE_S)
    if result.returncode != 0:
        pulled = execute([docker, "pull", "--quiet", ref], text=True, timeout=NETWORK_S)
        result = execute(inspect, text=True, timeout=PROBE_S)
        if result.returncode != 0:
            said = (pulled.stderr or result.stderr).strip().splitlines()
            raise BadInput(
                f"image {ref!r} is neither here nor pullable ({said[-1] if said else 'no output'}); "
                f"pass a wheel path or an image reference that exists"
            )
    image_id, _, labels = result.stdout.strip().partition(" ")
    return image_id, shlex.split((json.loads(labels or "null") or {}).get(RUNTIME_ARGS_LABEL, ""))


class TestReportCheck(ReportCheck):
    def described(self) -> list[str]:
        report: TestReport = self.report
        passed = sum(result.passed for result in report.results)
        rows = [
            f"  {report.artifact.kind.value} {report.artifact.name}  {report.artifact.digest[:19]}",
            f"  gpu {report.gpu.describe()}; python {report.python}; {report.started}",
            f"  {len(report.results)} command(s): {passed} passed, {len(report.results) - passed} failed",
        ]
        return rows + [f"    {result.verdict} {result.command} ({result.outcome()})" for result in report.results]


def read_report(path: Path) -> TestReport:
    return TestReport.from_json(read_json(path, "test", f"`test` and `prove` write <wheel>{SUFFIX}"), str(path))


def check_report(path: Path, docker: str | None = None) -> TestReportCheck:
    """A wheel's report must sit beside that wheel (its name minus .test.json) with the same sha256; an image's
    report must name an image whose ref still resolves, here, to the recorded ID."""
    report = read_report(path)
    artifact = report.artifact
    if artifact.kind is ArtifactKind.WHEEL:
        wheel = path.with_name(path.name.removesuffix(SUFFIX))
        mismatch = None
        if wheel.name != artifact.name:
            mismatch = f"artifact name: report names {artifact.name}, its file name says {wheel.name}"
        elif not wheel.is_file():
            mismatch = f"wheel: {wheel} is missing"
        elif (found := f"sha256:{file_sha256(wheel)}") != artifact.digest:
            mismatch = f"sha256: report {artifact.digest}, wheel beside it {found}"
        return TestReportCheck(str(path), report, (mismatch,) if mismatch else ())
    docker = docker or shutil.which(os.environ.get("CARRY_DOCKER") or "docker")
    if docker is None:
        raise BadInput("checking an image's test report needs docker; install it or set $CARRY_DOCKER")
    result = execute([docker, "image", "inspect", "--format", "{{.Id}}", artifact.name], text=True, timeout=PROBE_S)
    if result.returncode != 0:
        return TestReportCheck(str(path), report, (f"image: {artifact.name} is not here; pull it first",))
    image_id = result.stdout.strip()
    mismatch = f"image id: report {artifact.digest}, {artifact.name} is {image_id}"
    return TestReportCheck(str(path), report, () if image_id == artifact.digest else (mismatch,))


def summary(report: TestReport, path: Path) -> list[str]:
    """What `test` prints: one line per command, the last output line of each failure, the report's path."""
    rows = [f"gpu {report.gpu.describe()}"]
    for result in report.results:
        rows.append(f"{result.verdict}  {result.command}  ({result.outcome()}, {result.duration_s:.1f} s)")
        if not result.passed and result.last_line():
            rows.append(f"      {result.last_line()}")
    rows.append(f"report {path}")
    return rows


def with_test_report(wheel: Path, result: Verification) -> Verification:
    """`verify` of a wheel: a test report beside the wheel must belong to it (same sha256); say what it recorded."""
    report_path = wheel_report_path(wheel)
    if not report_path.exists():
        return result
    check = check_report(report_path)
    passed = sum(r.passed for r in check.report.results)
    note = (
        f"test report {report_path.name}: {passed}/{len(check.report.results)} passed on {check.report.gpu.describe()}"
    )
    return check.added_to(result, "test report", "a report of this wheel", note)

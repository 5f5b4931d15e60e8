"""Gate: does every CUDA shared object in a build run on every GPU the arch list asks for?

A GPU of compute capability X.Y runs a cubin built for X.Y itself (any variant), a plain or 'f'
cubin for X.Z with Z < Y ('a' cubins run on their own chip only), or, JIT-compiled at load time,
PTX it can compile: plain PTX for any capability up to X.Y, 'f' PTX for X.Z with Z <= Y, 'a' PTX
for X.Y only. JIT passes the gate only for list entries that ask for PTX (``+PTX``, ``compute_``).
An empty list (``none``) expects no CUDA code: the gate then fails any shared object that holds some.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Iterable

from carry import fatbin
from carry.arch import ArchList, ComputeCapability, CudaTarget, Variant
from carry.errors import BadInput, Failed
from carry.fatbin import FatbinEntry, Kind

NO_CUDA_CODE = "no CUDA code in the wheel"
UNEXPECTED_CUDA = "CUDA code in a wheel that expects none"


class How(Enum):
    """How a GPU gets code for it from a binary, best first."""

    EXACT = "exact"
    COMPATIBLE = "compatible"
    FAMILY = "family"
    JIT = "jit"
    NONE = "none"

    @property
    def native(self) -> bool:
        return self in (How.EXACT, How.COMPATIBLE, How.FAMILY)


@dataclass(frozen=True)
class Coverage:
    """The best way a GPU runs a binary, and the fatbin entry that provides it."""

    how: How
    via: FatbinEntry | None = None

    def acceptable_for(self, target: CudaTarget) -> bool:
        return self.how.native or (self.how is How.JIT and target.ptx)

    def describe(self, target: CudaTarget) -> str:
        """One line of the gate's outcome for a target: ``12.1: exact via sm_121 [ok]``."""
        verdict = "ok" if self.acceptable_for(target) else "FAIL"
        if self.how is How.NONE:
            return f"{target}: nothing runs on it [{verdict}]"
        how = "JIT only" if self.how is How.JIT else self.how.value
        return f"{target}: {how} via {self.via} [{verdict}]"


def coverage(entries: Iterable[FatbinEntry], gpu: ComputeCapability) -> Coverage:
    """How a GPU of capability `gpu` runs code from `entries` (a file's fatbin)."""
    options = [Coverage(_how(entry, gpu), entry) for entry in entries]
    usable = [option for option in options if option.how is not How.NONE]
    if not usable:
        return Coverage(How.NONE)
    order = list(How)
    return min(usable, key=lambda c: (order.index(c.how), tuple(-n for n in c.via.capability)))


def _how(entry: FatbinEntry, gpu: ComputeCapability) -> How:
    if entry.kind is Kind.CUBIN:
        return _cubin_how(entry, gpu)
    return How.JIT if _ptx_compiles_for(entry, gpu) else How.NONE


def _cubin_how(entry: FatbinEntry, gpu: ComputeCapability) -> How:
    if entry.major != gpu.major or entry.minor > gpu.minor:
        return How.NONE
    if entry.minor == gpu.minor:
        return How.EXACT
    return {
        Variant.PLAIN: How.COMPATIBLE,
        Variant.FAMILY: How.FAMILY,
        Variant.ARCH_SPECIFIC: How.NONE,
    }[entry.variant]


def _ptx_compiles_for(entry: FatbinEntry, gpu: ComputeCapability) -> bool:
    if entry.variant is Variant.PLAIN:
        return entry.capability <= gpu.value
    if entry.variant is Variant.FAMILY:
        return entry.major == gpu.major and entry.minor <= gpu.minor
    return entry.capability == gpu.value


@dataclass(frozen=True)
class GateFailure:
    """A requested target a file cannot run on; no `path` or `target` when there is no CUDA code."""

    path: Path | None
    target: CudaTarget | None
    message: str


@dataclass(frozen=True)
class FileReport:
    """One shared object: what its fatbin holds and how each requested target runs it."""

    path: Path
    entries: tuple[FatbinEntry, ...]
    coverage: tuple[tuple[CudaTarget, Coverage], ...]

    @property
    def has_cuda(self) -> bool:
        return bool(self.entries)

    @property
    def held(self) -> str:
        """What the fatbin holds, e.g. ``compute_90, sm_120, sm_121``."""
        return ", ".join(sorted({str(entry) for entry in self.entries})) or "no CUDA code"

    def failures(self) -> list[GateFailure]:
        return [
            GateFailure(self.path, target, _failure_message(self, target, found))
            for target, found in self.coverage
            if not found.acceptable_for(target)
        ]

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "cuda": self.has_cuda,
            "entries": sorted({str(entry) for entry in self.entries}),
            "targets": {
                str(target): {
                    "how": found.how.value,
                    "via": str(found.via) if found.via else None,
                    "ok": found.acceptable_for(target),
                }
                for target, found in self.coverage
            },
        }


@dataclass(frozen=True)
class GateReport:
    """The gate's verdict over a set of shared objects for one arch list."""

    archlist: ArchList
    files: tuple[FileReport, ...]

    @property
    def failures(self) -> list[GateFailure]:
        if not self.archlist.expects_cuda:
            return [GateFailure(report.path, None, _unexpected_message(report)) for report in self.files
                    if report.has_cuda]
        if not any(report.has_cuda for report in self.files):
            return [GateFailure(None, None, f"{NO_CUDA_CODE}: {self._no_cuda_detail()}")]
        return [failure for report in self.files for failure in report.failures()]

    def lines(self) -> list[str]:
        """What the gate proved, per shared object and target (printed by `wheel` and `verify`)."""
        if not self.archlist.expects_cuda and self.ok:
            where = f"{len(self.files)} shared object(s)" if self.files else "the wheel (no shared objects)"
            return [f"no CUDA code expected (cuda_arches none), none found in {where}"]
        rows = []
        for report in self.files:
            rows.append(f"{report.path}: {report.held}")
            rows.extend(f"  {found.describe(target)}" for target, found in report.coverage)
        return rows

    @property
    def ok(self) -> bool:
        return not self.failures

    def raise_for_failures(self) -> None:
        """Raise `Failed` with the first failure and a count of the rest."""
        failures = self.failures
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise Failed(f"arch gate: {failures[0].message}{more}")

    def to_json(self) -> dict:
        return {
            "cuda_arches": str(self.archlist),
            "ok": self.ok,
            "files": [report.to_json() for report in self.files],
            "failures": [
                {
                    "path": str(failure.path) if failure.path else None,
                    "target": str(failure.target) if failure.target else None,
                    "message": failure.message,
                }
                for failure in self.failures
            ],
        }

    def _no_cuda_detail(self) -> str:
        if not self.files:
            return f"no shared objects found, but cuda_arches is {self.archlist}"
        return f"none of {len(self.files)} shared objects has a {fatbin.SECTION} section"


def _unexpected_message(report: FileReport) -> str:
    return (
        f"{UNEXPECTED_CUDA}: {report.path} holds {report.held} but cuda_arches is none; set build.cuda_arches "
        f"(or --arch) to the GPUs it must run on, or build without CUDA (e.g. VLLM_TARGET_DEVICE=empty)"
    )


def _failure_message(report: FileReport, target: CudaTarget, found: Coverage) -> str:
    gpu = target.capability
    if found.how is How.JIT:
        return (
            f"{report.path}: no cubin runs on {gpu} (sm_{gpu.number}), "
            f"only {found.via} by JIT at load; "
            f"build sm_{gpu.number} or ask for '{gpu}+PTX' to accept JIT"
        )
    return f"{report.path}: nothing runs on {gpu} (sm_{gpu.number}); the fatbin holds {report.held}"


def check_files(paths: Iterable[str | Path], archlist: ArchList, root: Path | None = None) -> GateReport:
    """Gate every ELF shared object in `paths` (files, or directories searched for ``*.so``).

    With `root`, reports name files relative to it (e.g. their path inside an unpacked wheel).
    """
    reports = tuple(_check_file(path, archlist, root) for path in _shared_objects(paths))
    return GateReport(archlist, reports)


def _check_file(path: Path, archlist: ArchList, root: Path | None) -> FileReport:
    entries = tuple(fatbin.read(path))
    shown = path.relative_to(root) if root else path
    if not entries:
        return FileReport(shown, (), ())
    found = tuple((target, coverage(entries, target.capability)) for target in archlist)
    return FileReport(shown, entries, found)


def _shared_objects(paths: Iterable[str | Path]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise BadInput(f"arch gate: {path} does not exist; pass built .so files or a directory")
        candidates = sorted(_so_files_under(path)) if path.is_dir() else [path]
        found.extend(p for p in candidates if fatbin.is_elf(p))
    return found


def may_be_shared_object(name: str) -> bool:
    """Whether a file name looks like a shared object the gate checks (`x.so`, `x.cpython-311.so`, `x.so.1`)."""
    return ".so" in PurePosixPath(name).suffixes


def _so_files_under(directory: Path) -> Iterable[Path]:
    for path in directory.rglob("*.so*"):
        if path.is_file() and not path.is_symlink() and may_be_shared_object(path.name):
            yield path

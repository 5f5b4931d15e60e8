"""Verify an artifact against this repo: provenance fields must match, the CUDA code must satisfy the gate policy
the wheel was built with, its shared objects must be code for its CPU, and it must hold exactly the patched tree.

`inspect_wheel` is the check every produced wheel passes before it is stamped, and `verify_wheel` runs it again
on a wheel from anywhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from carry.arch import ArchList
from carry.binaries import buildinfo, gate, treecheck
from carry.binaries import sharedobjects as binaries
from carry.binaries.gatepolicy import GatePolicy
from carry.config.build import Generated
from carry.platforms import Platform
from carry.util.errors import Failed


@dataclasses.dataclass(frozen=True)
class Expected:
    """What this repo says the artifact must be built from; `mirror` and `tree` let its files be compared."""

    version: str
    series_hash: str
    commit: str
    tree: str | None = None
    mirror: Path | None = None
    generated: tuple[Generated, ...] = ()
    precompiled: dict[str, str] = dataclasses.field(default_factory=dict)  # platform -> pinned sha256


@dataclasses.dataclass(frozen=True)
class Mismatch:
    field: str
    expected: str
    found: str

    def describe(self) -> str:
        return f"{self.field}: expected {self.expected}, found {self.found}"


@dataclasses.dataclass(frozen=True)
class Inspection:
    """What a wheel's contents prove: the gate (CUDA code per arch, CPU per shared object) and the tree check."""

    gate: gate.GateReport
    tree: treecheck.TreeCheck | None
    metadata: tuple[str, ...] = ()  # what a precompiled build's metadata got wrong
    proven: tuple[str, ...] = ()  # lines of what else was proven (precompiled: where the binaries come from)
    problems: tuple[str, ...] = ()  # what else is wrong, each named (a locked image's files against its lock)

    @property
    def ok(self) -> bool:
        return self.gate.ok and (self.tree is None or self.tree.ok) and not self.metadata and not self.problems

    def summary(self) -> str:
        parts = [] if self.gate.ok else [f"gate: {len(self.gate.failures)} problem(s)"]
        parts += [] if self.tree is None or self.tree.ok else [f"tree: {len(self.tree.problems)} file(s)"]
        parts += [f"metadata: {len(self.metadata)} problem(s)"] if self.metadata else []
        parts += [f"contents: {len(self.problems)} problem(s)"] if self.problems else []
        return ", ".join(parts) or "ok"

    def _tail(self) -> list[str]:
        return (
            (self.tree.lines() if self.tree else [])
            + [f"FAIL metadata: {m}" for m in self.metadata]
            + [f"FAIL {problem}" for problem in self.problems]
        )

    def lines(self) -> list[str]:
        return [*self.proven, *self.gate.lines(), *self._tail()]

    def full_lines(self) -> list[str]:
        return [*self.proven, *self.gate.full_lines(), *self._tail()]


def wheel_platform(path: Path) -> Platform | None:
    """The platform of a wheel's file-name tag (None for `any`)."""
    return Platform.from_wheel_tag(path.name.removesuffix(".whl").rsplit("-", 1)[-1])


def inspect_wheel(
    wheel: Path,
    policy: GatePolicy,
    mirror: Path | None,
    tree: str | None,
    generated: tuple[Generated, ...],
    precompiled: dict[str, str] | None = None,
    platform: Platform | None = None,
) -> Inspection:
    """Gate every shared object in `wheel` by `policy` and for the CPU of `platform` (default: its tag's);
    compare its files with `tree` (when given)."""
    report = gate.check(binaries.from_wheel(wheel), policy, platform or wheel_platform(wheel))
    checked = None
    if mirror is not None and tree is not None:
        checked = treecheck.compare(
            wheel, tree, treecheck.tree_files(mirror, tree), generated, precompiled, treecheck.ignored_by(mirror, tree)
        )
    return Inspection(report, checked)


@dataclasses.dataclass(frozen=True)
class Verification:
    subject: str
    info: dict
    mismatches: tuple[Mismatch, ...]
    checks: Inspection | None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.mismatches and (self.checks is None or self.checks.ok)

    def lines(self) -> list[str]:
        info = self.info
        rows = [
            f"{self.subject}:",
            f"  version {info.get('version')}  series {str(info.get('series', {}).get('hash'))[:12]}"
            f"  commit {str(info.get('upstream', {}).get('commit'))[:12]}",
            f"  wheel {info.get('wheel_version')}  arches {info.get('cuda_arches')}  "
            f"patches {', '.join(p['name'] for p in info.get('series', {}).get('patches', []))}",
            *(f"  {note}" for note in self.notes),
            *(f"  MISMATCH {m.describe()}" for m in self.mismatches),
        ]
        if self.checks is not None:
            shown = self.checks.lines() if self.checks.ok else self.checks.full_lines()
            rows += [f"  {line}" for line in shown]
        rows.append("  verified" if self.ok else "  NOT verified")
        return rows


def compare(info: dict, expected: Expected) -> tuple[Mismatch, ...]:
    """The provenance fields that differ from what this repo would build now."""
    found = {
        "version": str(info.get("version")),
        "series_hash": str(info.get("series", {}).get("hash")),
        "upstream.commit": str(info.get("upstream", {}).get("commit")),
    }
    wanted = {"version": expected.version, "series_hash": expected.series_hash, "upstream.commit": expected.commit}
    mismatches = [Mismatch(field, wanted[field], found[field]) for field in wanted if found[field] != wanted[field]]
    if expected.tree and info.get("tree") and info["tree"] != expected.tree:
        mismatches.append(Mismatch("tree", expected.tree, str(info["tree"])))
    return tuple(mismatches)


def recorded_policy(info: dict, where: str) -> GatePolicy:
    """The gate policy a wheel was built with (its buildinfo); a buildinfo from before policies: the arches."""
    if isinstance(recorded := info.get("gate_policy"), dict):
        return GatePolicy.from_json(recorded, where)
    return GatePolicy(ArchList.parse(info.get("cuda_arches", "")))


def verify_wheel(path: Path, expected: Expected, arches: ArchList | None = None) -> Verification:
    """RECORD hashes, the buildinfo against `expected`, the gate by the policy the wheel records (its arches,
    or `arches`), the CPU of every shared object against the wheel's tag, and the tree check."""
    info = buildinfo.read(path)
    if info is None:
        raise Failed(f"{path}: no {buildinfo.FILENAME} in the wheel; it was not built by carry")
    mismatches = list(compare(info, expected))
    if info.get("version") and info["version"] not in buildinfo.wheel_version(path):
        mismatches.append(
            Mismatch("wheel version", f"a local label with {info['version']}", buildinfo.wheel_version(path))
        )
    policy = recorded_policy(info, f"{path.name} buildinfo")
    if arches is not None:
        policy = policy.with_arches(arches)
    tree = info.get("tree") if expected.tree in (None, info.get("tree")) else None
    platform = wheel_platform(path)
    taken = info.get("precompiled") or None
    checks = inspect_wheel(
        path, policy, expected.mirror, tree, expected.generated, taken.get("members") if taken else None
    )
    if taken:
        from carry.wheelbuild import precompiled

        wanted = expected.precompiled.get(str(platform))
        if wanted != taken.get("sha256"):
            mismatches.append(
                Mismatch(
                    "precompiled wheel",
                    f"{str(wanted)[:12]} (build.precompiled for {platform})",
                    f"{str(taken.get('sha256'))[:12]} ({taken.get('wheel')})",
                )
            )
        checks = dataclasses.replace(
            checks,
            proven=(
                f"precompiled: {len(checks.tree.precompiled) if checks.tree else '?'} member(s) "
                f"byte-identical to {taken.get('wheel')} (sha256 {str(taken.get('sha256'))[:8]}…), "
                f"built from {taken.get('ref')}",
            ),
            metadata=tuple(
                precompiled.metadata_problems(path, tuple(taken.get("requires_dist", ())), str(taken.get("wheel")))
            ),
        )
    if platform is not None and info.get("platform") not in (None, str(platform)):
        mismatches.append(Mismatch("buildinfo platform", str(platform), str(info.get("platform"))))
    return Verification(str(path), info, tuple(mismatches), checks)

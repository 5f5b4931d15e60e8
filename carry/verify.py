"""Verify an artifact against this repo: provenance fields must match, CUDA code must cover the arches."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from carry import buildinfo, gate
from carry.arch import ArchList
from carry.errors import Failed
from carry.fsutil import temp_dir
from carry.platforms import Platform, wrong_machine


@dataclasses.dataclass(frozen=True)
class Expected:
    """What this repo says the artifact must be built from."""

    version: str
    series_hash: str
    commit: str


@dataclasses.dataclass(frozen=True)
class Mismatch:
    field: str
    expected: str
    found: str

    def describe(self) -> str:
        return f"{self.field}: expected {self.expected}, found {self.found}"


@dataclasses.dataclass(frozen=True)
class Verification:
    subject: str
    info: dict
    mismatches: tuple[Mismatch, ...]
    gate: gate.GateReport | None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.mismatches and (self.gate is None or self.gate.ok)

    def lines(self) -> list[str]:
        info = self.info
        rows = [f"{self.subject}:"]
        rows += [f"  version {info.get('version')}  series {str(info.get('series', {}).get('hash'))[:12]}"
                 f"  commit {str(info.get('upstream', {}).get('commit'))[:12]}"]
        rows += [f"  wheel {info.get('wheel_version')}  arches {info.get('cuda_arches')}  "
                 f"patches {', '.join(p['name'] for p in info.get('series', {}).get('patches', []))}"]
        rows += [f"  {note}" for note in self.notes]
        rows += [f"  MISMATCH {m.describe()}" for m in self.mismatches]
        if self.gate is not None:
            rows += [f"  {line}" for line in self.gate.lines()]
            rows += [f"  GATE {failure.message}" for failure in self.gate.failures]
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
    return tuple(Mismatch(field, wanted[field], found[field]) for field in wanted if found[field] != wanted[field])


def verify_wheel(path: Path, expected: Expected, scratch: Path, arches: ArchList | None = None) -> Verification:
    """Check RECORD hashes, the buildinfo against `expected`, and run the arch gate on every .so."""
    info = buildinfo.read(path)
    if info is None:
        raise Failed(f"{path}: no {buildinfo.FILENAME} in the wheel; it was not built by carry")
    mismatches = list(compare(info, expected))
    if info.get("version") and info["version"] not in buildinfo.wheel_version(path):
        mismatches.append(Mismatch("wheel version", f"a local label with {info['version']}",
                                   buildinfo.wheel_version(path)))
    wanted = arches if arches is not None else ArchList.parse(info.get("cuda_arches", ""))
    platform = Platform.from_wheel_tag(path.name.removesuffix(".whl").rsplit("-", 1)[-1])
    notes: tuple[str, ...] = ()
    with temp_dir(scratch, "verify-") as unpacked:
        buildinfo.extract(path, unpacked)
        report = gate.check_files([unpacked], wanted, root=unpacked)
        if platform is not None:
            libs = [unpacked / file.path for file in report.files]
            mismatches += [Mismatch("shared object", platform.machine, problem)
                           for problem in wrong_machine(libs, platform, unpacked)]
            notes = (f"platform {platform}: {len(libs)} shared object(s) checked for {platform.machine} code",)
    if platform is not None and info.get("platform") not in (None, str(platform)):
        mismatches.append(Mismatch("buildinfo platform", str(platform), str(info.get("platform"))))
    return Verification(str(path), info, tuple(mismatches), report, notes)

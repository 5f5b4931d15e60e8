"""Gate: does every CUDA shared object run on every GPU the policy asks for, and is it code for the right CPU?

A GPU X.Y runs a cubin for X.Y (any variant), a plain or 'f' cubin for X.Z with Z < Y ('a' cubins run on their own
chip only), or JIT-compiled PTX: plain up to X.Y, 'f' for X.Z with Z <= Y, 'a' for X.Y only; JIT passes only where
the list asks for PTX (``+PTX``, ``compute_``) or the object's rule accepts it. A GPU a rule says the object is not
built for is reported so and does not fail; an empty list (``none``) fails any CUDA code. The gate is pure: it
judges `SharedObject`s by a `GatePolicy`.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterable
from enum import Enum

from carry.arch import ComputeCapability, CudaTarget, Variant
from carry.binaries.fatbin import FatbinEntry, Kind
from carry.binaries.gatepolicy import GatePolicy, GateRule
from carry.binaries.sharedobjects import SharedObject
from carry.platforms import Platform, machine_name

NO_CUDA_CODE = "no CUDA code in the wheel"
UNEXPECTED_CUDA = "CUDA code in a wheel that expects none"
WIDTH = 80
LEGEND = (
    "exact/compat/family: a cubin that runs there; JIT: PTX compiled at load; by design: not built for it "
    "(a gate rule); NOTHING: no code runs there; ! fails the gate"
)


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


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The best way a GPU runs a binary, and the fatbin entry that provides it."""

    how: How
    via: FatbinEntry | None = None


def coverage(entries: Iterable[FatbinEntry], gpu: ComputeCapability) -> Coverage:
    """How a GPU of capability `gpu` runs code from `entries` (a file's fatbin)."""
    usable = [(how, entry) for entry in entries if (how := _how(entry, gpu)) is not How.NONE]
    if not usable:
        return Coverage(How.NONE)
    order = list(How)
    how, entry = min(usable, key=lambda u: (order.index(u[0]), tuple(-n for n in u[1].capability)))
    return Coverage(how, entry)


def _how(entry: FatbinEntry, gpu: ComputeCapability) -> How:
    if entry.kind is Kind.CUBIN:
        return _cubin_how(entry, gpu)
    return How.JIT if _ptx_compiles_for(entry, gpu) else How.NONE


def _cubin_how(entry: FatbinEntry, gpu: ComputeCapability) -> How:
    if entry.major != gpu.major or entry.minor > gpu.minor:
        return How.NONE
    if entry.minor == gpu.minor:
        return How.EXACT
    return {Variant.PLAIN: How.COMPATIBLE, Variant.FAMILY: How.FAMILY, Variant.ARCH_SPECIFIC: How.NONE}[entry.variant]


def _ptx_compiles_for(entry: FatbinEntry, gpu: ComputeCapability) -> bool:
    if entry.variant is Variant.PLAIN:
        return entry.capability <= gpu.value
    if entry.variant is Variant.FAMILY:
        return entry.major == gpu.major and entry.minor <= gpu.minor
    return entry.capability == gpu.value


@dataclasses.dataclass(frozen=True)
class Cell:
    """One shared object on one requested GPU: how it runs there, and whether the policy is satisfied."""

    target: CudaTarget
    found: Coverage
    in_scope: bool  # False: a rule says the object is not built for this GPU
    jit_accepted: bool

    @property
    def ok(self) -> bool:
        return self.found.how.native or (self.found.how is How.JIT and self.jit_accepted) or not self.in_scope

    @property
    def by_design(self) -> bool:
        return not self.in_scope and self.found.how is How.NONE

    def text(self) -> str:
        """The table's cell (`exact sm_90`, `JIT compute_80`, `by design`, `NOTHING`), with ` !` when it fails."""
        if self.by_design:
            return "by design"
        how = self.found.how
        if how is How.NONE:
            shown = "NOTHING"
        else:
            word = {How.EXACT: "exact", How.COMPATIBLE: "compat", How.FAMILY: "family", How.JIT: "JIT"}[how]
            shown = f"{word} {self.found.via}"
        return shown if self.ok else f"{shown} !"

    def describe(self) -> str:
        """In words: `12.1: family via sm_120f [ok]`, `9.0: not built for it (by design) [ok]`."""
        if self.by_design:
            return f"{self.target}: not built for it (by design) [ok]"
        how = self.found.how
        verdict = "ok" if self.ok else "FAIL"
        if how is How.NONE:
            return f"{self.target}: nothing runs on it [{verdict}]"
        word = {How.JIT: "JIT", How.COMPATIBLE: "compatible"}.get(how, how.value)
        return f"{self.target}: {word} via {self.found.via} [{verdict}]"

    def to_json(self) -> dict:
        return {
            "how": self.found.how.value,
            "via": str(self.found.via) if self.found.via else None,
            "ok": self.ok,
            "by_design": self.by_design,
            "in_scope": self.in_scope,
            "text": self.text(),
        }


@dataclasses.dataclass(frozen=True)
class GateFailure:
    """What fails: a GPU an object cannot run on, wrong-CPU code, or unexpected CUDA (`path` None: the whole wheel)."""

    path: str | None
    target: CudaTarget | None
    message: str


@dataclasses.dataclass(frozen=True)
class ObjectReport:
    """One shared object: what its fatbin holds, the rule that applies to it, and one cell per requested GPU."""

    obj: SharedObject
    rule: GateRule | None
    cells: tuple[Cell, ...]

    @property
    def path(self) -> str:
        return self.obj.path

    @property
    def has_cuda(self) -> bool:
        return self.obj.has_cuda

    @property
    def held(self) -> str:
        """What the fatbin holds, e.g. ``compute_90, sm_120, sm_121``."""
        return ", ".join(_held(self.obj.entries)) or "no CUDA code"

    def failures(self) -> list[GateFailure]:
        return [GateFailure(self.path, cell.target, _failure_message(self, cell)) for cell in self.cells if not cell.ok]

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "machine": machine_name(self.obj.machine) if self.obj.machine is not None else None,
            "cuda": self.has_cuda,
            "entries": _held(self.obj.entries),
            "rule": self.rule.match if self.rule else None,
            "targets": {str(cell.target): cell.to_json() for cell in self.cells},
        }


@dataclasses.dataclass(frozen=True)
class GateReport:
    """The gate's verdict over a set of shared objects for one policy (and, when given, one CPU)."""

    policy: GatePolicy
    objects: tuple[ObjectReport, ...]
    platform: Platform | None = None

    @property
    def unmatched_rules(self) -> tuple[GateRule, ...]:
        return tuple(rule for rule in self.policy.rules if not any(rule.matches(o.path) for o in self.objects))

    @property
    def failures(self) -> list[GateFailure]:
        found = self._cpu_failures()
        if not self.policy.arches.expects_cuda:
            return found + [GateFailure(o.path, None, _unexpected_message(o)) for o in self.objects if o.has_cuda]
        if not any(o.has_cuda for o in self.objects):
            return found + [GateFailure(None, None, f"{NO_CUDA_CODE}: {self._no_cuda_detail()}")]
        return found + [failure for o in self.objects for failure in o.failures()]

    @property
    def ok(self) -> bool:
        return not self.failures

    def _cpu_failures(self) -> list[GateFailure]:
        if self.platform is None:
            return []
        return [
            GateFailure(
                o.path,
                None,
                f"{o.path} is {machine_name(o.obj.machine)} code (ELF e_machine {o.obj.machine}), not "
                f"{self.platform.machine} ({self.platform.e_machine}) as {self.platform} needs",
            )
            for o in self.objects
            if o.obj.machine is not None and o.obj.machine != self.platform.e_machine
        ]

    # --- what is printed ------------------------------------------------------------------------------

    def lines(self, width: int = WIDTH) -> list[str]:
        """The summary and the coverage table, grouped where rows are alike; the failures in full."""
        rows = [self.headline()]
        if self.policy.arches.expects_cuda:
            rows.append(f"policy: {self.policy.describe_rules()}")
        if self.policy.arches.expects_cuda and any(o.has_cuda for o in self.objects):
            rows += self._table(width)
        rows += self._plain_objects(width)
        rows += self._cpu_line()
        rows += [f"rule matched no shared object: {rule.describe()}" for rule in self.unmatched_rules]
        rows += [f"FAIL {failure.message}" for failure in self.failures]
        return rows

    def full_lines(self, width: int = WIDTH) -> list[str]:
        """`lines()`, what each shared object holds and every rule with its reason (`.gate.txt`; printed on failure)."""
        rows = self.lines(width)
        cuda = [o for o in self.objects if o.has_cuda]
        if cuda:
            rows += ["", "what each shared object holds:"]
            rows += [wrapped for o in cuda for wrapped in _wrap(f"  {o.path}: {o.held}", width, "      ")]
        if self.policy.rules:
            rows += ["", f"gate rules ({self.policy.source}):"]
            for rule in self.policy.rules:
                rows += _wrap(f"  {rule.describe()}: {rule.why}", width, "      ")
        if cuda:
            rows += ["", *_wrap(f"legend: {LEGEND}", width, "  ")]
        return rows

    def headline(self) -> str:
        count = f"{len(self.objects)} shared object(s)" if self.objects else "no shared objects"
        verdict = "passed" if self.ok else f"FAILED ({len(self.failures)} problem(s))"
        if not self.policy.arches.expects_cuda:
            where = f"in {count}" if self.objects else "in the wheel (no shared objects)"
            expectation = "none found" if self.ok else "some found"
            return f"arch gate {verdict}: no CUDA code expected (cuda_arches none), {expectation} {where}"
        return f"arch gate {verdict}: {count}, arches {self.policy.arches}"

    def _table(self, width: int) -> list[str]:
        """One row per group of shared objects whose cells are alike; a name too long for its column on its own line."""
        cuda = [o for o in self.objects if o.has_cuda]
        groups: dict[tuple[str, ...], list[str]] = {}
        for o in cuda:
            groups.setdefault(tuple(cell.text() for cell in o.cells), []).append(o.path)
        names = _short_names([o.path for o in cuda])
        headers = [str(target) for target in self.policy.arches]
        widths = [max([len(h)] + [len(key[i]) for key in groups]) + 1 for i, h in enumerate(headers)]
        joined = max(len(", ".join(names[p] for p in paths)) for paths in groups.values())
        name_width = max(12, min(joined, width - sum(widths) - 2))

        def row(first: str, cells: list[str]) -> str:
            return (f"{first:<{name_width}}  " + "".join(f"{c:<{w}}" for c, w in zip(cells, widths))).rstrip()

        rows = [row("", headers)]
        for key, paths in groups.items():
            listed = _wrap(", ".join(names[p] for p in paths), name_width, "")
            if len(listed[0]) > name_width:
                rows += [listed[0], row("", list(key))]
            else:
                rows.append(row(listed[0], list(key)))
            rows += listed[1:]
        return rows

    def _plain_objects(self, width: int) -> list[str]:
        plain = [o.path for o in self.objects if not o.has_cuda]
        if not plain or not self.policy.arches.expects_cuda:
            return []
        names = _short_names(plain)
        return _wrap("no CUDA code: " + ", ".join(names[p] for p in plain), width, "  ")

    def _cpu_line(self) -> list[str]:
        if self.platform is None or not self.objects:
            return []
        right = sum(o.obj.machine == self.platform.e_machine for o in self.objects)
        return [f"cpu: {right}/{len(self.objects)} shared object(s) are {self.platform.machine} code ({self.platform})"]

    def to_json(self) -> dict:
        return {
            "policy": self.policy.to_json(),
            "cuda_arches": str(self.policy.arches),
            "platform": str(self.platform) if self.platform else None,
            "ok": self.ok,
            "files": [o.to_json() for o in self.objects],
            "unmatched_rules": [rule.to_json() for rule in self.unmatched_rules],
            "failures": [
                {"path": f.path, "target": str(f.target) if f.target else None, "message": f.message}
                for f in self.failures
            ],
        }

    def _no_cuda_detail(self) -> str:
        if not self.objects:
            return f"no shared objects found, but cuda_arches is {self.policy.arches}"
        return f"none of {len(self.objects)} shared objects has a .nv_fatbin section"


def check(objects: Iterable[SharedObject], policy: GatePolicy, platform: Platform | None = None) -> GateReport:
    """Judge every shared object by `policy` (and its CPU against `platform`, when given)."""
    reports = []
    for obj in sorted(objects, key=lambda o: o.path):
        rule = policy.rule_for(obj.path)
        jit = bool(rule and rule.jit)
        cells = tuple(
            Cell(t, coverage(obj.entries, t.capability), rule is None or rule.covers(t.capability), t.ptx or jit)
            for t in (policy.arches if obj.has_cuda else ())
        )
        reports.append(ObjectReport(obj, rule, cells))
    return GateReport(policy, tuple(reports), platform)


def _held(entries: Iterable[FatbinEntry]) -> list[str]:
    """Entries as names, sorted by kind (cubins first) then capability: `sm_75, …, sm_120f, compute_80`."""
    unique = {str(entry): entry for entry in entries}
    return sorted(
        unique, key=lambda name: (unique[name].kind is Kind.PTX, unique[name].capability, unique[name].variant.value)
    )


def _short_names(paths: list[str]) -> dict[str, str]:
    """Paths less their shared directory and extension-module suffix (`.abi3.so`); in full where two would match."""
    parts = [path.split("/") for path in paths]
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    short = {
        path: "/".join(p[common:]).split(".", 1)[0] if "." in p[-1] else "/".join(p[common:])
        for path, p in zip(paths, parts)
    }
    return short if len(set(short.values())) == len(short) else {path: path for path in paths}


def _wrap(text: str, width: int, indent: str) -> list[str]:
    lines = textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
    return lines or [text]


def _unexpected_message(report: ObjectReport) -> str:
    return (
        f"{UNEXPECTED_CUDA}: {report.path} holds {report.held} but cuda_arches is none; set build.cuda_arches "
        f"(or --arch) to the GPUs it must run on, or build without CUDA (e.g. VLLM_TARGET_DEVICE=empty)"
    )


def _failure_message(report: ObjectReport, cell: Cell) -> str:
    gpu = cell.target.capability
    if cell.found.how is How.JIT:
        return (
            f"{report.path}: no cubin runs on {gpu} (sm_{gpu.number}), only {cell.found.via} by JIT at load; "
            f"build sm_{gpu.number}, ask for '{gpu}+PTX', or add a gate rule with jit: true to accept JIT"
        )
    return f"{report.path}: nothing runs on {gpu} (sm_{gpu.number}); the fatbin holds {report.held}"

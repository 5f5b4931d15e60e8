"""The attestation kinds by name, one table (`KINDS`): each is a `Kind`, its in-toto predicate type, how it makes
its predicate from one platform's facts (or says why this image has none) and how `verify` checks a statement of it
read back. `image --push` attaches the kinds `chosen` from `--attest NAME[=ARG]` (the defaults, `DEFAULT`, and
those named), the publish stage (carry.image.publish) loops over them, carry.image.inspect.trustcheck over the whole
table, and carry.trust.attach names a predicate type by it. Adding a kind: its predicate module, its entry here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Protocol

from carry.trust import provenance, sbom, signing
from carry.trust.facts import ImageFacts, dist_name
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_bytes


@dataclasses.dataclass(frozen=True)
class Making:
    """What a kind makes its predicate from besides the facts: dist/, whether the image is locked, the start time."""

    dist: Path
    locked: bool
    started: str


@dataclasses.dataclass(frozen=True)
class Made:
    """A kind's predicate for one platform, or None and why not; the line and JSON fields of what it wrote."""

    predicate: dict | None
    why_not: str = ""
    line: str = ""
    fields: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Checking:
    """What a kind's statement is checked against: the distributions the layers install, what this repository says
    (None without a checkout), the image's labels and platform, and every statement read, by predicate type."""

    installed: list[tuple[str, str]]
    expected: provenance.Expected | None
    labels: dict[str, str]
    platform: str
    by_type: dict[str, dict]
    require: tuple[str, ...] = ()  # `verify --require NAME`: these must be there, and a report must pass


class Kind(Protocol):
    name: str  # as --attest names it
    title: str  # what verify's lines about it begin with
    predicate_type: str

    def required(self, hermetic: bool) -> bool:
        """Whether verify fails an image without it (`hermetic`: every installed wheel's sha256 is known)."""
        ...

    def resolve(self, arg: str) -> str:
        """`--attest NAME=ARG`'s ARG, checked before any work (bad input when it is not one this kind takes)."""
        ...

    def make(self, facts: ImageFacts, making: Making, arg: str) -> Made: ...

    def check(self, statement: dict, checking: Checking) -> tuple[list[str], list[str]]:
        """(proven lines, problems) for a statement read back whose envelope verified."""
        ...


class _NoArg:
    name: str

    def resolve(self, arg: str) -> str:
        if arg:
            raise BadInput(f"--attest {self.name}={arg}: {self.name} takes no ARG")
        return arg


class Sbom(_NoArg):
    """CycloneDX 1.6 (carry.trust.sbom), also written to dist/; only a hermetic image has one."""

    name, title, predicate_type = "sbom", "SBOM", "https://cyclonedx.org/bom"

    def required(self, hermetic: bool) -> bool:
        return hermetic

    def make(self, facts: ImageFacts, making: Making, arg: str) -> Made:
        if not facts.hermetic:
            none = {"sbom": None, "sbom_bytes": 0, "components": 0}
            return Made(None, f"{facts.platform}: no SBOM: {facts.no_sbom}", fields=none)
        document = sbom.make(facts)
        problem = sbom.validate(document)
        if problem is not None:
            raise Failed(f"the SBOM of {facts.repository} {facts.platform} is not valid CycloneDX 1.6: {problem}")
        making.dist.mkdir(parents=True, exist_ok=True)
        path = making.dist / dist_name(facts)
        atomic_write_bytes(path, document + b"\n")
        predicate = json.loads(document)
        count = len(predicate["components"])
        line = (
            f"sbom       {facts.platform}: {path} ({len(document) / 1e3:,.1f} kB, {count} components, CycloneDX "
            f"1.6, schema-valid)"
        )
        return Made(predicate, line=line, fields={"sbom": str(path), "sbom_bytes": len(document), "components": count})

    def check(self, statement: dict, checking: Checking) -> tuple[list[str], list[str]]:
        document = statement["predicate"]
        invalid = sbom.validate(json.dumps(document).encode())
        problems = [f"SBOM: not valid CycloneDX 1.6: {invalid}"] if invalid else []
        listed = sbom.installed(document)
        problems += sbom.against_layers(listed, checking.installed)
        if problems:
            return [], problems
        patches = len(((sbom.pedigreed(document) or {}).get("pedigree") or {}).get("patches") or [])
        return [
            f"SBOM: signed, CycloneDX 1.6, {len(listed)} components = the {len(checking.installed)} distributions the "
            f"layers install; the fixed package's pedigree carries {patches} patch(es)"
            + _other_statement_type(statement)
        ], []


class Provenance(_NoArg):
    """SLSA v1 (carry.trust.provenance)."""

    name, title, predicate_type = "provenance", "provenance", "https://slsa.dev/provenance/v1"

    def required(self, hermetic: bool) -> bool:
        return True

    def make(self, facts: ImageFacts, making: Making, arg: str) -> Made:
        return Made(provenance.make(facts, making.locked, making.started, now()))

    def check(self, statement: dict, checking: Checking) -> tuple[list[str], list[str]]:
        try:
            found = provenance.read(statement["predicate"])
        except (KeyError, TypeError, AttributeError):
            return [], ["provenance: not carry's SLSA v1 provenance (unreadable buildDefinition/runDetails)"]
        document = checking.by_type.get(SBOM.predicate_type, {}).get("predicate")
        fixed = sbom.pedigreed(document) if document is not None else None
        problems = provenance.self_consistent(found, fixed, checking.labels, checking.platform)
        expected = checking.expected
        problems += provenance.against_repository(found, expected) if expected is not None else []
        if problems:
            return [], problems
        return [
            f"provenance: signed SLSA v1 by {found.builder}; commit {found.commit[:12]}, {len(found.patches)} "
            f"patch(es), VERSION {found.version}"
            + (
                "; consistent with itself, the SBOM and the labels"
                if expected is None
                else ", equal to this repository's commit, series, fixed wheel and lock"
                if expected.fixed_sha256
                else ", equal to this repository's commit, series and VERSION"
            )
        ], []


class Suite:
    """The fixed wheel's upstream-suite report (`<wheel>.suite.json`): at ARG, else beside it in dist/ if about it."""

    name, title, predicate_type = "suite", "suite", "urn:carry:upstream-suite:v1"

    def required(self, hermetic: bool) -> bool:
        return False

    def resolve(self, arg: str) -> str:
        if arg and not Path(arg).is_file():
            raise BadInput(f"--attest suite={arg}: no such report (`carry suite WHEEL` writes <wheel>.suite.json)")
        return str(Path(arg).absolute()) if arg else ""

    def make(self, facts: ImageFacts, making: Making, arg: str) -> Made:
        path = Path(arg) if arg else making.dist / f"{facts.fixed.filename}.suite.json"
        if not path.is_file():
            return Made(None, f"{facts.platform}: no suite report: {path} is missing" if arg else "")
        try:
            report = json.loads(path.read_text())
            about, kind = report["wheel"]["sha256"], report["kind"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Failed(f"{path}: not a carry suite report ({exc})") from None
        if kind != "carry-upstream-suite" or about != f"sha256:{facts.fixed.sha256}":
            return Made(None, f"{facts.platform}: no suite report: {path} is not about {facts.fixed.filename}")
        return Made(report, line=f"suite      {facts.platform}: {path.name}: {report['verdict']}: {report['line']}")

    def check(self, statement: dict, checking: Checking) -> tuple[list[str], list[str]]:
        report = statement["predicate"]
        try:
            wheel, against, line = report["wheel"], report["against"], f"{report['verdict']}: {report['line']}"
            fixed = provenance.read(checking.by_type[PROVENANCE.predicate_type]["predicate"]).wheels["fixed-wheel"]
        except (KeyError, TypeError, AttributeError):
            return [], ["suite: not a carry suite report about the provenance's fixed wheel"]
        if wheel.get("sha256") != f"sha256:{fixed[1]}":
            return [], [f"suite: the report is about {wheel.get('name')}, the image installs {fixed[0]}"]
        if self.name in checking.require and report.get("verdict") != "PASS":
            return [], [f"suite: --require suite, and the signed report says {line}"]
        return [f"suite: signed report of the fixed wheel, {line}; against {against.get('name')}"], []


SBOM = Sbom()
PROVENANCE = Provenance()
KINDS: dict[str, Kind] = {kind.name: kind for kind in (SBOM, PROVENANCE, Suite())}
DEFAULT: tuple[tuple[str, str], ...] = (("sbom", ""), ("provenance", ""), ("suite", ""))


def chosen(asked: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`--attest NAME[=ARG]`, each given once or more: (name, arg) in the table's order, the defaults and those
    named (`NAME=off` leaves a default out); an unknown name is bad input."""
    found = dict(DEFAULT)
    for spec in asked:
        name, _, arg = spec.partition("=")
        if name not in KINDS:
            raise BadInput(f"--attest {name!r}: no such attestation; the known ones: {', '.join(KINDS)}")
        found[name] = arg if arg == "off" else KINDS[name].resolve(arg)
    return tuple((name, found[name]) for name in KINDS if name in found and found[name] != "off")


def required(asked: tuple[str, ...]) -> None:
    """`verify --require NAME`: each a name of the table, else bad input."""
    for name in asked:
        if name not in KINDS:
            raise BadInput(f"--require {name!r}: no such attestation; the known ones: {', '.join(KINDS)}")


def title(predicate_type: str) -> str:
    """The name verify's lines give a predicate type (the URI itself for one not in the table)."""
    return next((kind.title for kind in KINDS.values() if kind.predicate_type == predicate_type), predicate_type)


def _other_statement_type(statement: dict) -> str:
    """What differs from carry's own statements: another in-toto Statement version (`cosign attest` writes v0.1)."""
    found = statement.get("_type")
    return "" if found == signing.STATEMENT_TYPE else f"; its statement is {found} (carry's own are Statement v1)"


def now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

"""`verify IMAGE --key PUB`: what carry.trust attached to a pushed image, checked against the key, the image's own
layers and (from a checkout) this repository:

- the simple-signing signature of each platform manifest (and of the index the tag names) verifies with the key
  and names that digest and the repository;
- the SBOM and provenance envelopes under `.att` verify with the key and are about that digest;
- the SBOM lists exactly the distributions the layers install (read by carry.image.inspect.imagefs, each `*.dist-info`),
  and is valid CycloneDX 1.6;
- the provenance agrees with itself, the SBOM and the labels, and, from a checkout, names this repository's
  commit, series (each patch's sha256), VERSION, the fixed wheel in dist/ and the lock.

Without a checkout (no build.yaml), `verify_without_checkout` reads the image's dist-info from its layers and does
all but the comparison with a repository, and says so."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from carry.image.inspect.installcheck import canonical, same_version
from carry.platforms import Platform
from carry.trust import attach, provenance, sbom
from carry.trust.keys import PublicKey
from carry.util.errors import Failed
from carry.util.record import record

if TYPE_CHECKING:
    from carry.image.inspect.imagefs import ImageFiles, Selection


@dataclasses.dataclass(frozen=True)
class Expected:
    """What this repository says the provenance must name."""

    commit: str
    patches: tuple[tuple[str, str], ...]  # (file name, sha256) in order
    version: str
    fixed_sha256: str  # "" when dist/ does not hold it (a Dockerfile build's wheel is made in the image)
    lock: tuple[str, str] | None  # (file name, sha256)


@record(kw_only=True)
class Manifest:
    """One platform manifest checked: `repository@digest`, the image of `platform`, with its config's `labels`."""

    repository: str
    digest: str
    platform: Platform
    labels: dict[str, str]


def check_platform(
    store: attach.Registry,
    key: PublicKey,
    manifest: Manifest,
    installed: list[tuple[str, str]],
    expected: Expected | None,
    sbom_required: bool = True,
) -> tuple[list[str], list[str]]:
    """(proven lines, problems) for one platform manifest; a Dockerfile build without --hermetic has no SBOM
    (`sbom_required` False), but one that is there is checked all the same."""
    repository, digest, platform, labels = manifest.repository, manifest.digest, manifest.platform, manifest.labels
    started = time.monotonic()
    proven: list[str] = []
    problems: list[str] = []
    signature = attach.check_signature(store, key, repository, digest)
    if signature.ok:
        proven.append(
            f"signature: {signature.tag} verifies with the key {key.fingerprint[:19]}… for {repository}@{digest[:19]}…"
        )
    problems += [f"signature: {p}" for p in signature.problems]
    wanted = (attach.CYCLONEDX, attach.SLSA_PROVENANCE) if sbom_required else (attach.SLSA_PROVENANCE,)
    statements = attach.read_statements(store, key, digest, wanted)
    problems += list(statements.problems)
    document = statements.by_type.get(attach.CYCLONEDX, {}).get("predicate")
    fixed_component = None
    if document is not None:
        import json

        invalid = sbom.validate(json.dumps(document).encode())
        if invalid:
            problems.append(f"SBOM: not valid CycloneDX 1.6: {invalid}")
        listed = sbom.installed(document)
        problems += _against_layers(listed, installed)
        fixed_component = next((c for c in document.get("components") or [] if c.get("pedigree")), None)
        if not any(p.startswith("SBOM") for p in problems):
            patches = len(((fixed_component or {}).get("pedigree") or {}).get("patches") or [])
            proven.append(
                f"SBOM: signed, CycloneDX 1.6, {len(listed)} components = the {len(installed)} distributions the "
                f"layers install; the fixed package's pedigree carries {patches} patch(es)"
                + _other_statement_type(statements.by_type[attach.CYCLONEDX])
            )
    predicate = statements.by_type.get(attach.SLSA_PROVENANCE, {}).get("predicate")
    if predicate is not None:
        try:
            found = provenance.read(predicate)
        except (KeyError, TypeError, AttributeError):
            problems.append("provenance: not carry's SLSA v1 provenance (unreadable buildDefinition/runDetails)")
            found = None
        if found is not None:
            own = provenance.self_consistent(found, fixed_component, labels, str(platform))
            problems += own
            compared = _against_repository(found, expected) if expected is not None else []
            problems += compared
            if not own and not compared:
                proven.append(
                    f"provenance: signed SLSA v1 by {found.builder}; commit {found.commit[:12]}, "
                    f"{len(found.patches)} patch(es), VERSION {found.version}"
                    + (
                        "; consistent with itself, the SBOM and the labels"
                        if expected is None
                        else ", equal to this repository's commit, series, fixed wheel and lock"
                        if expected.fixed_sha256
                        else ", equal to this repository's commit, series and VERSION"
                    )
                )
    proven.append(f"trust checks: {time.monotonic() - started:.1f} s")
    return proven, problems


def _other_statement_type(statement: dict) -> str:
    """What differs from carry's own statements: another in-toto Statement version (`cosign attest` writes v0.1)."""
    from carry.trust import signing

    found = statement.get("_type")
    return "" if found == signing.STATEMENT_TYPE else f"; its statement is {found} (carry's own are Statement v1)"


def check_index(store: attach.Registry, key: PublicKey, repository: str, digest: str) -> tuple[list[str], list[str]]:
    signature = attach.check_signature(store, key, repository, digest)
    if signature.ok:
        return [f"signature: the index {signature.tag} verifies with the key"], []
    return [], [f"signature of the index: {p}" for p in signature.problems]


def _against_layers(listed: dict[tuple[str, str], str], installed: list[tuple[str, str]]) -> list[str]:
    problems = []
    remaining = dict(listed)
    for name, version in installed:
        match = next((k for k in remaining if k[0] == canonical(name) and same_version(k[1], version)), None)
        if match is None:
            problems.append(f"SBOM: {name} {version} is installed in the layers but not in the SBOM")
        else:
            remaining.pop(match)
    problems += [f"SBOM: lists {name} {version}, which the layers do not install" for name, version in remaining]
    return problems


def _against_repository(found: provenance.Read, expected: Expected) -> list[str]:
    problems = []
    if found.commit != expected.commit:
        problems.append(f"provenance: upstream commit {found.commit}, this repository pins {expected.commit}")
    if list(found.patches) != list(expected.patches):
        problems.append(
            "provenance: patches "
            + ", ".join(f"{n} {s[:12]}" for n, s in found.patches)
            + "; this repository's series: "
            + ", ".join(f"{n} {s[:12]}" for n, s in expected.patches)
        )
    if found.version != expected.version:
        problems.append(f"provenance: VERSION {found.version}, this repository's {expected.version}")
    fixed = found.wheels.get("fixed-wheel")
    if expected.fixed_sha256 and (fixed is None or fixed[1] != expected.fixed_sha256):
        problems.append(
            f"provenance: fixed wheel sha256 {fixed[1][:12] if fixed else 'missing'}…, dist/'s "
            f"{expected.fixed_sha256[:12]}…"
        )
    if expected.lock is not None and (found.lock is None or found.lock[1] != expected.lock[1]):
        problems.append(
            f"provenance: lock sha256 {found.lock[1][:12] if found.lock else 'missing'}…, "
            f"{expected.lock[0]}'s {expected.lock[1][:12]}…"
        )
    return problems


# -- without a checkout ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrustOnly:
    """One platform checked without a repository: what was proven, the problems, what could not be compared."""

    subject: str
    proven: tuple[str, ...]
    problems: tuple[str, ...]
    not_compared: str

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        rows = [f"{self.subject}:"]
        rows += [f"  {line}" for line in self.proven]
        rows += [f"  FAIL {problem}" for problem in self.problems]
        rows.append(f"  not compared: {self.not_compared}")
        rows.append("  verified (signature, SBOM, provenance)" if self.ok else "  NOT verified")
        return rows


NOT_COMPARED = (
    "no build.yaml here, so the provenance's commit, series and wheels were not compared with a repository, and "
    "the files were not proven against a lock and dist/ (run verify from the checkout for that)"
)


def verify_without_checkout(
    ref: str, key: PublicKey, platform: Platform | None, docker_cli: str
) -> tuple[TrustOnly, ...]:
    """Every platform of `ref` (or the one asked), read from the registry: signature, SBOM against the layers'
    dist-info, provenance against itself, the SBOM and the labels."""
    from carry.image import registry, registryhttp
    from carry.image.inspect import imagefs

    repository = registryhttp.repository_of(ref)
    client = registry.client()
    results = []
    with registry.credentials(ref, docker_cli) as login:
        remote = registry.remote_platforms(client, ref, login)
        if remote is None:
            raise Failed(f"cannot verify {ref}: its registry does not have it (a signed image is in a registry)")
        wanted = [platform] if platform is not None else list(remote[1])
        missing = [p for p in wanted if p not in remote[1]]
        if missing:
            raise Failed(f"{ref} holds {', '.join(map(str, remote[1]))}, not {', '.join(map(str, missing))}")
        store = registryhttp.Repository.of(repository, login.auth)
        selection = dist_info_selection()
        insecure = registry.insecure(client, registry.registry_of(ref))
        for target in wanted:
            files = imagefs.from_registry(ref, target, selection, login.auth, insecure)
            if files is None:
                raise Failed(f"cannot read {ref} for {target} from its registry")
            dists = _installed(files)
            manifest = Manifest(repository=repository, digest=files.digest, platform=target, labels=files.labels)
            proven, problems = check_platform(store, key, manifest, dists, None)
            if files.digest != remote[0]:
                more_proven, more_problems = check_index(store, key, repository, remote[0])
                proven, problems = more_proven + proven, more_problems + problems
            proven.insert(
                0,
                f"platform {target}: read from the registry ({len(files.layers)} layers, {len(dists)} "
                f"distributions) in {files.seconds:.1f} s",
            )
            results.append(
                TrustOnly(f"{ref} {target} ({files.digest[:19]})", tuple(proven), tuple(problems), NOT_COMPARED)
            )
    return tuple(results)


def dist_info_selection() -> Selection:
    """What the trust checks read of an image: each `*.dist-info/METADATA` under the venv."""
    from carry.image.inspect import imagefs, installcheck

    return imagefs.Selection(
        prefixes=(f"{installcheck.VENV}/",),
        keep=lambda path: path.startswith(f"{installcheck.VENV}/lib/") and path.endswith(".dist-info/METADATA"),
    )


def installed_in(files: ImageFiles) -> list[tuple[str, str]]:
    return _installed(files)


def _installed(files: ImageFiles) -> list[tuple[str, str]]:
    import posixpath

    from carry.image.inspect.installcheck import SITE_RE, _headers

    found = []
    for path, node in sorted(files.nodes.items()):
        directory, name = posixpath.split(path)
        if name != "METADATA" or not directory.endswith(".dist-info"):
            continue
        site = SITE_RE.match(directory)
        if site is None or posixpath.dirname(directory) != site.group(0):
            continue
        headers = _headers(node.data or b"")
        found.append((headers.get("Name", posixpath.basename(directory)), headers.get("Version", "?")))
    return found

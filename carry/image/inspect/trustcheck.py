"""`verify IMAGE --key PUB`: what carry.trust attached to a pushed image, checked against the key, the image's own
layers and (from a checkout) this repository: each manifest's signature (and the index's), the SBOM and provenance
envelopes under `.att` about that digest, the SBOM against the distributions the layers install, and the provenance
against itself, the SBOM, the labels and (from a checkout) this repository's commit, series, VERSION, fixed wheel and
lock. Without a checkout, `verify_without_checkout` does all but the last, and says so."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from carry.platforms import Platform
from carry.trust import attach, kinds, provenance
from carry.trust.keys import PublicKey
from carry.util.errors import Failed
from carry.util.record import record

if TYPE_CHECKING:
    from carry.image.inspect.imagefs import ImageFiles, Selection


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
    expected: provenance.Expected | None,
    hermetic: bool = True,
    require: tuple[str, ...] = (),
    index: str = "",
) -> tuple[list[str], list[str]]:
    """(proven lines, problems) for one platform manifest, each kind of carry.trust.kinds that is there checked; a
    kind not `required` of it (a Dockerfile build without --hermetic has no SBOM) nor in `require` may be missing.
    With the `index` that names it (another digest), that index's signature is checked too, its lines first."""
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
    wanted = tuple(k.predicate_type for k in kinds.KINDS.values() if k.required(hermetic) or k.name in require)
    statements = attach.read_statements(store, key, digest, wanted)
    problems += list(statements.problems)
    checking = kinds.Checking(installed, expected, labels, str(platform), statements.by_type, require)
    for kind in kinds.KINDS.values():
        statement = statements.by_type.get(kind.predicate_type)
        if statement is not None and statement.get("predicate") is not None:
            more_proven, more_problems = kind.check(statement, checking)
            proven, problems = proven + more_proven, problems + more_problems
    proven.append(f"trust checks: {time.monotonic() - started:.1f} s")
    if index and index != digest:
        more = check_index(store, key, repository, index)
        proven, problems = more[0] + proven, more[1] + problems
    return proven, problems


def check_index(store: attach.Registry, key: PublicKey, repository: str, digest: str) -> tuple[list[str], list[str]]:
    signature = attach.check_signature(store, key, repository, digest)
    if signature.ok:
        return [f"signature: the index {signature.tag} verifies with the key"], []
    return [], [f"signature of the index: {p}" for p in signature.problems]


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
    ref: str, key: PublicKey, platform: Platform | None, docker_cli: str, require: tuple[str, ...] = ()
) -> tuple[TrustOnly, ...]:
    """Every platform of `ref` (or the one asked) read from the registry and its trust checked without a repository."""
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
            dists = installed_in(files)
            manifest = Manifest(repository=repository, digest=files.digest, platform=target, labels=files.labels)
            proven, problems = check_platform(store, key, manifest, dists, None, require=require, index=remote[0])
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

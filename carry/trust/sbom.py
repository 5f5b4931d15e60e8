"""The image's SBOM: CycloneDX 1.6 JSON made with cyclonedx-python-lib, from what carry knows exactly (the lock, the
fixed wheel, the series, the base image), not from scanning the image.

- `metadata.component`: the image, whose `pedigree.ancestors` is the runtime base image with its digest;
- `components`: the lock's packages plus the fixed wheel (purl, sha256 of the wheel), nothing else;
- the fixed wheel's `pedigree`: the upstream release wheel and source it was made from, the commit, and one patch per
  carried patch (its type from DEP-3 Upstream-Status, its diff, and the URLs it resolves);
- `metadata.tools`: carry and its version.

Validated against the CycloneDX 1.6 schema (`validate`)."""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING

from carry.trust.facts import CarriedPatch, ImageFacts, Wheel

if TYPE_CHECKING:
    from cyclonedx.model.component import Component, Patch, Pedigree

SPEC = "1.6"
PURL_FILE = "file_name"


def _library(wheel: Wheel, pedigree: Pedigree | None = None) -> Component:
    from cyclonedx.model import HashAlgorithm, HashType
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    qualifiers = {PURL_FILE: wheel.filename} if wheel.filename else None
    return Component(
        type=ComponentType.LIBRARY,
        name=wheel.name,
        version=wheel.version,
        bom_ref=f"pypi/{wheel.canonical}@{wheel.version}",
        purl=PackageURL(type="pypi", name=wheel.canonical, version=wheel.version, qualifiers=qualifiers),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=wheel.sha256)] if wheel.sha256 else None,
        pedigree=pedigree,
    )


PR_URL = re.compile(r"/(?:pull|issues|merge_requests)/(\d+)/?$")


def _urls(text: str | None) -> list[str]:
    return re.findall(r"\S+://\S+", text or "")


def _patch(patch: CarriedPatch, facts: ImageFacts) -> Patch:
    from cyclonedx.model import AttachedText, XsUri
    from cyclonedx.model.component import Diff, Patch, PatchClassification
    from cyclonedx.model.issue import IssueClassification, IssueType, IssueTypeSource

    word = (patch.status or "").split(" ", 1)[0].lower()
    kind = {"backport": PatchClassification.BACKPORT, "accepted": PatchClassification.CHERRY_PICK}.get(
        word, PatchClassification.UNOFFICIAL
    )
    urls = list(dict.fromkeys(_urls(patch.forwarded) + _urls(patch.status)))
    resolves = []
    for url in urls:
        number = PR_URL.search(url)
        resolves.append(
            IssueType(
                type=IssueClassification.DEFECT,
                id=f"#{number.group(1)}" if number else None,
                name=patch.subject[:200] or patch.name,
                description=f"{patch.name}: Upstream-Status {patch.status or '(none)'}",
                source=IssueTypeSource(name="upstream", url=XsUri(url)),
                references=[XsUri(url)],
            )
        )
    if not resolves:
        resolves.append(
            IssueType(
                type=IssueClassification.DEFECT,
                id=f"#{facts.upstream_pr}" if facts.upstream_pr else None,
                name=patch.subject[:200] or patch.name,
                description=f"{patch.name}: Upstream-Status {patch.status or '(none)'}; Forwarded "
                f"{patch.forwarded or '(none)'}",
            )
        )
    diff = Diff(text=AttachedText(content=patch.text, content_type="text/x-diff"))
    return Patch(type=kind, diff=diff, resolves=resolves)


def _fixed(facts: ImageFacts) -> Component:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri
    from cyclonedx.model.component import Commit, Component, ComponentType, Pedigree

    ancestors = [_library(facts.release)] if facts.release is not None else []
    source_ref = []
    if "://" in facts.upstream_url:
        source_ref = [ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(facts.upstream_url))]
    ancestors.append(
        Component(
            type=ComponentType.LIBRARY,
            name=facts.fixed.name,
            version=facts.upstream_commit,
            bom_ref=f"upstream/{facts.fixed.canonical}@{facts.upstream_commit}",
            description=f"the upstream source at commit {facts.upstream_commit}"
            + (f" (PR #{facts.upstream_pr})" if facts.upstream_pr else ""),
            external_references=source_ref,
        )
    )
    commit = Commit(uid=facts.upstream_commit, url=XsUri(facts.upstream_url) if "://" in facts.upstream_url else None)
    pedigree = Pedigree(
        ancestors=ancestors,
        commits=[commit],
        patches=[_patch(patch, facts) for patch in facts.patches],
        notes=f"carried by carry: {len(facts.patches)} patch(es) on {facts.upstream_commit}, series sha256 "
        f"{facts.series_hash}",
    )
    return _library(facts.fixed, pedigree)


def _image(facts: ImageFacts) -> Component:
    from cyclonedx.model import HashAlgorithm, HashType
    from cyclonedx.model.component import Component, ComponentType, Pedigree

    algorithm, _, value = facts.base_digest.partition(":")
    base = Component(
        type=ComponentType.CONTAINER,
        name=facts.base_ref,
        version=facts.base_digest,
        bom_ref=f"base/{facts.base_ref}",
        description="the runtime base image",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=value)] if algorithm == "sha256" else None,
    )
    return Component(
        type=ComponentType.CONTAINER,
        name=facts.repository,
        version=facts.version,
        bom_ref=f"image/{facts.repository}@{facts.version}/{facts.platform}",
        description=f"{facts.platform} image of {facts.repository}:{facts.version}",
        pedigree=Pedigree(ancestors=[base]),
    )


def make(facts: ImageFacts) -> bytes:
    """The SBOM of one platform's image, as CycloneDX 1.6 JSON bytes (deterministic for the same facts)."""
    import datetime

    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6

    components = [_library(wheel) for wheel in facts.distributions] + [_fixed(facts)]
    tools = ToolRepository(
        components=[Component(type=ComponentType.APPLICATION, name="carry", version=facts.carry_version)]
    )
    try:
        when = datetime.datetime.fromisoformat(facts.created.replace("Z", "+00:00"))
    except ValueError:
        when = None
    identity = f"{facts.repository}:{facts.version}:{facts.platform}:{facts.fixed.sha256}:"
    identity += facts.lock.sha256 if facts.lock else ""
    image = _image(facts)
    bom = Bom(
        components=components,
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, identity),
        metadata=BomMetaData(tools=tools, component=image, timestamp=when),
    )
    bom.register_dependency(image, components)
    text = JsonV1Dot6(bom).output_as_string(indent=None)
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")).encode()


def validate(document: bytes) -> str | None:
    """None when `document` is valid CycloneDX 1.6 JSON, else the schema's complaint."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(document.decode())
    return None if error is None else str(error)[:400]


def installed(document: dict) -> dict[tuple[str, str], str]:
    """(canonical name, version) -> wheel sha256 of every library component an SBOM lists."""
    from carry.trust.facts import canonical

    found = {}
    for component in document.get("components") or []:
        if component.get("type") != "library":
            continue
        sha = next((h.get("content", "") for h in component.get("hashes") or [] if h.get("alg") == "SHA-256"), "")
        found[(canonical(component.get("name", "")), component.get("version", ""))] = sha
    return found


def fixed_component(document: dict, name: str) -> dict | None:
    from carry.trust.facts import canonical

    named = (c for c in document.get("components") or [] if canonical(c.get("name", "")) == canonical(name))
    return next((c for c in named if c.get("pedigree")), None)


def pedigreed(document: dict) -> dict | None:
    """The component with a pedigree (the fixed package), if any."""
    return next((c for c in document.get("components") or [] if c.get("pedigree")), None)


def against_layers(listed: dict[tuple[str, str], str], installed: list[tuple[str, str]]) -> list[str]:
    """Problems found comparing what an SBOM lists with the distributions the layers install."""
    from carry.trust.facts import canonical, same_version

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

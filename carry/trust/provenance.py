"""SLSA provenance v1 for one platform's image (the predicate of an in-toto Statement v1 whose subject is the
platform manifest's digest), from carry.trust.facts: the build type (locked or dockerfile image), the config,
VERSION and platform as external parameters, every input as a resolved dependency (the upstream commit, each patch,
the fixed and release wheels, the runtime lock, the base image), and carry as the builder.

`check` compares a provenance with a repository (commit, series, wheels, lock, VERSION) or, without one, with
itself and the SBOM."""

from __future__ import annotations

import dataclasses

from carry.trust.facts import ImageFacts, Wheel, canonical

BUILDER = "urn:carry:builder"
LOCKED_TYPE = "urn:carry:locked-image:v1"
DOCKERFILE_TYPE = "urn:carry:dockerfile-image:v1"


def _wheel(wheel: Wheel, role: str) -> dict:
    return {
        "uri": f"pkg:pypi/{wheel.canonical}@{wheel.version}",
        "name": wheel.filename,
        "digest": {"sha256": wheel.sha256},
        "annotations": {"role": role},
    }


def make(facts: ImageFacts, locked: bool, started: str, finished: str) -> dict:
    dependencies: list[dict] = [
        {
            "uri": f"git+{facts.upstream_url}@{facts.upstream_commit}",
            "digest": {"gitCommit": facts.upstream_commit},
            "annotations": {"role": "upstream", **({"pr": str(facts.upstream_pr)} if facts.upstream_pr else {})},
        }
    ]
    dependencies += [
        {
            "name": f"patches/{patch.name}",
            "digest": {"sha256": patch.sha256},
            "annotations": {"role": "patch", "upstreamStatus": patch.status or "", "forwarded": patch.forwarded or ""},
        }
        for patch in facts.patches
    ]
    if facts.fixed.sha256:
        dependencies.append(_wheel(facts.fixed, "fixed-wheel"))
    if facts.release is not None:
        dependencies.append(_wheel(facts.release, "precompiled-wheel"))
    if facts.lock is not None:
        dependencies.append(
            {"name": facts.lock.path, "digest": {"sha256": facts.lock.sha256}, "annotations": {"role": "lock"}}
        )
    algorithm, _, value = facts.base_digest.partition(":")
    dependencies.append(
        {"uri": facts.base_ref, "digest": {algorithm or "sha256": value}, "annotations": {"role": "base-image"}}
    )
    return {
        "buildDefinition": {
            "buildType": LOCKED_TYPE if locked else DOCKERFILE_TYPE,
            "externalParameters": {
                "config": {"path": facts.config.path, "sha256": facts.config.sha256, "text": facts.config.text},
                "version": facts.version,
                "platform": facts.platform,
            },
            "internalParameters": {"seriesHash": facts.series_hash, "hermetic": facts.hermetic},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": BUILDER, "version": {"carry": facts.carry_version}},
            "metadata": {"startedOn": started, "finishedOn": finished},
        },
    }


@dataclasses.dataclass(frozen=True)
class Expected:
    """What this repository says the provenance must name."""

    commit: str
    patches: tuple[tuple[str, str], ...]  # (file name, sha256) in order
    version: str
    fixed_sha256: str  # "" when dist/ does not hold it (a Dockerfile build's wheel is made in the image)
    lock: tuple[str, str] | None  # (file name, sha256)


@dataclasses.dataclass(frozen=True)
class Read:
    """What a provenance says, in the terms carry compares."""

    commit: str
    patches: tuple[tuple[str, str], ...]  # (name, sha256) in order
    wheels: dict[str, tuple[str, str]]  # role -> (file name, sha256)
    lock: tuple[str, str] | None  # (path, sha256)
    version: str
    platform: str
    series_hash: str
    builder: str


def read(predicate: dict) -> Read:
    """A provenance predicate read; KeyError/TypeError when it is not carry's shape."""
    definition = predicate["buildDefinition"]
    commit, patches, wheels, lock = "", [], {}, None
    for dependency in definition.get("resolvedDependencies") or []:
        role = (dependency.get("annotations") or {}).get("role")
        digest = dependency.get("digest") or {}
        if role == "upstream":
            commit = digest.get("gitCommit", "")
        elif role == "patch":
            patches.append((dependency.get("name", "").removeprefix("patches/"), digest.get("sha256", "")))
        elif role in ("fixed-wheel", "precompiled-wheel"):
            wheels[role] = (dependency.get("name", ""), digest.get("sha256", ""))
        elif role == "lock":
            lock = (dependency.get("name", ""), digest.get("sha256", ""))
    external = definition.get("externalParameters") or {}
    return Read(
        commit,
        tuple(patches),
        wheels,
        lock,
        str(external.get("version", "")),
        str(external.get("platform", "")),
        str((definition.get("internalParameters") or {}).get("seriesHash", "")),
        str(predicate["runDetails"]["builder"]["id"]),
    )


def series_hash(patches: tuple[tuple[str, str], ...]) -> str:
    """The series hash carry labels images with (carry.source.series: sha256 over the patches' sha256 lines)."""
    import hashlib

    return hashlib.sha256("\n".join(sha for _, sha in patches).encode()).hexdigest()


def self_consistent(found: Read, sbom_fixed: dict | None, labels: dict[str, str], platform: str) -> list[str]:
    """Problems found comparing a provenance with itself, the SBOM's fixed component and the image's labels."""
    problems = []
    if series_hash(found.patches) != found.series_hash:
        problems.append(
            f"provenance: its patches hash to {series_hash(found.patches)[:12]}…, it says {found.series_hash[:12]}…"
        )
    if found.platform != platform:
        problems.append(f"provenance: platform {found.platform}, the image is {platform}")
    for label, value in (("io.carry.upstream.commit", found.commit), ("io.carry.series.hash", found.series_hash)):
        if label in labels and labels[label] != value:
            problems.append(f"provenance: {label} label {labels[label][:12]}…, the provenance says {value[:12]}…")
    if "io.carry.version" in labels and labels["io.carry.version"] != found.version:
        problems.append(f"provenance: VERSION {found.version}, the io.carry.version label {labels['io.carry.version']}")
    if sbom_fixed is not None:
        sha = next((h.get("content") for h in sbom_fixed.get("hashes") or [] if h.get("alg") == "SHA-256"), "")
        fixed = found.wheels.get("fixed-wheel")
        if fixed is None or fixed[1] != sha:
            problems.append(
                f"provenance: the fixed wheel's sha256 {fixed[1][:12] if fixed else 'missing'}…, the SBOM's "
                f"{canonical(sbom_fixed.get('name', ''))} {sha[:12]}…"
            )
        patched = len((sbom_fixed.get("pedigree") or {}).get("patches") or [])
        if patched != len(found.patches):
            problems.append(f"provenance: {len(found.patches)} patch(es), the SBOM's pedigree {patched}")
    return problems


def against_repository(found: Read, expected: Expected) -> list[str]:
    """Problems found comparing a provenance with what this repository says it must name."""
    problems = []
    if found.commit != expected.commit:
        problems.append(f"provenance: upstream commit {found.commit}, this repository pins {expected.commit}")
    if list(found.patches) != list(expected.patches):
        listed, series = (", ".join(f"{n} {s[:12]}" for n, s in p) for p in (found.patches, expected.patches))
        problems.append(f"provenance: patches {listed}; this repository's series: {series}")
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

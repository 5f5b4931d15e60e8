"""The locked, layered image (build.yaml `image.lock`): carry writes the layers itself, nothing of the target CPU
runs, no build context is sent (docs/images.md: "The locked image").

Per platform: the runtime lock's wheels are downloaded once into the download store (sha256 from the lock, pip's
own client and index settings); each layer is a deterministic tar written straight from the wheels' zips
(carry.image.locked.ocilayer), gzip-compressed with isal and streamed to the registry over its HTTP API
(carry.image.registryhttp), or, without --push, streamed into the local engine with `docker load`:

  base layers  the runtime base image's own, unchanged
  L1 venv      /opt/venv (pyvenv.cfg, python links, empty site-packages), /etc/carry/runtime.env, the entrypoint
  L2 nvidia    locked wheels named nvidia-* and cuda-*
  L3 torch     torch and its kin (TORCH_KIN)
  L4 deps      every other locked wheel
  L5 release   the upstream wheel the fixed wheel was made from (build.precompiled's pin)
  L6 fixed     the difference to installing the fixed wheel instead (changed and new files, the new dist-info,
               whiteouts for what it replaces); without a precompiled wheel L5 is absent and L6 is the wheel

A layer's digests are remembered by its contents' description (paths, modes, sizes, hashes, the compressor) in
$CARRY_CACHE/image-layers, so a rerun asks the registry (HEAD) and skips it: "already exists".

Here: `prepare` and `build`, over the stages: carry.image.locked.layerplan (the wheels fetched, the layers
planned), carry.image.locked.layerwrite (the image config, the layers pushed or loaded) and
carry.image.locked.smoketest (the smoke test, the pushed image pulled back and kept).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carry.config import Config
from carry.image import pushorder
from carry.image.layerpush import Digests, size_text
from carry.image.locked import engineimage, runtimelock
from carry.image.locked.layerplan import (
    PlatformPlan,
    fetch_wheels,
    plan_platform,
    release_wheel,
    requires_dist,
    runtime_base,
)
from carry.image.locked.layerwrite import PlatformOutcome, load_platform, push_platform
from carry.image.locked.smoketest import smoke, smoke_pushed
from carry.platforms import Platform
from carry.util.cache import Cache
from carry.util.download import Store
from carry.util.errors import BadInput
from carry.util.progress import Progress
from carry.util.record import record

if TYPE_CHECKING:
    import docker

    from carry.image.attest import Attester
    from carry.image.registryhttp import Repository
    from carry.image.vocabulary import ImagePlan, PlatformImage


# -- the whole image -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LockedImageResult:
    platforms: tuple[PlatformOutcome, ...]
    pushed: dict[str, str]  # ref -> digest
    shared: tuple[str, ...]
    notes: tuple[str, ...]
    duplicates: tuple[str, ...]
    trust: Any = None  # carry.image.attest.Attester: the SBOMs, signatures and attestations pushed

    def lines(self) -> list[str]:
        rows = []
        for outcome in self.platforms:
            rows += [f"  {layer.line(outcome.platform)}" for layer in outcome.layers]
            installed = sum(layer.written.installed for layer in outcome.layers)
            compressed = sum(layer.written.size for layer in outcome.layers)
            sent = sum(layer.written.size for layer in outcome.layers if layer.action == "pushed")
            rows.append(
                f"  {outcome.platform}: {len(outcome.layers)} layers, {size_text(compressed)} compressed, "
                f"{size_text(installed)} installed; {size_text(sent)} pushed; config "
                f"{outcome.config_action}; {outcome.seconds:.1f}s"
            )
            if outcome.smoke:
                rows.append(f"  smoke: {outcome.smoke}")
            if outcome.kept:
                rows.append(f"  engine: {outcome.kept.line(outcome.platform)}")
        rows += self.trust.lines() if self.trust is not None else []  # the tags come last: scripts read them
        for outcome in self.platforms:
            rows += [f"{ref}  {self.pushed.get(ref, outcome.digest)}  {outcome.platform}" for ref in outcome.refs]
        everything = ", ".join(str(o.platform) for o in self.platforms)
        rows += [f"{ref}  {self.pushed[ref]}  {everything}" for ref in self.shared if ref in self.pushed]
        return rows

    def to_json(self) -> dict:
        return {
            **({"trust": self.trust.to_json()} if self.trust is not None else {}),
            "pushed": self.pushed,
            "duplicates": list(self.duplicates),
            "platforms": [
                {
                    "platform": str(o.platform),
                    "refs": list(o.refs),
                    "digest": o.digest,
                    "seconds": o.seconds,
                    "config": o.config_action,
                    "smoke": o.smoke,
                    "engine": o.kept.to_json() if o.kept else None,
                    "layers": [
                        {"name": layer.name, "action": layer.action, "files": layer.files, **layer.written.to_json()}
                        for layer in o.layers
                    ],
                }
                for o in self.platforms
            ],
        }


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What `image` resolved before any work: per platform its lock (fresh), runtime base (its facts, the image the
    layers go on) and release wheel."""

    locks: dict
    bases: dict
    releases: dict
    facts: dict = dataclasses.field(default_factory=dict)  # Platform -> runtimelock.BaseFacts

    def labels(self, platform: Platform, labels: dict[str, str]) -> dict[str, str]:
        """The image's labels with what names its base (runtimebase.RuntimeBase.labels), as the lock does."""
        found = self.facts.get(platform)
        return {**labels, **found.base.labels()} if found is not None and found.base is not None else labels


def prepare(
    config: Config,
    cache: Cache,
    platforms: tuple[Platform, ...],
    client: docker.DockerClient,
    say: Callable[[str], None],
    say_base: Callable[[str], None] = lambda line: None,
) -> Prepared:
    """Locks read, the runtime bases resolved (pulled, derived where they have no python3) and the locks checked
    against the release wheel's Requires-Dist and the base: before any work."""
    bases, releases = {}, {}
    locks = {platform: runtimelock.read(config, platform) for platform in platforms}
    settings = config.build.precompiled
    for platform in platforms:
        pinned = settings is not None and settings.wheel_for(platform) is not None
        if not pinned and platform is not Platform.native() and config.arches_for(platform):
            raise BadInput(
                f"{config.path}: a locked image for {platform} needs its fixed wheel made on this machine: "
                f"set build.precompiled.wheels.{platform} (a wheel with no CUDA code, cuda_arches: [], is made "
                f"here for every platform)"
            )
    for platform in platforms:
        release = releases[platform] = release_wheel(config, cache, platform, say)
        if release is not None:  # a changed Requires-Dist is known before any base is pulled or derived
            runtimelock.check_requires(locks[platform], requires_dist(release))
    facts = runtimelock.bases(config, platforms, cache, say_base)
    for platform in platforms:
        resolved = facts[platform].base
        assert resolved is not None  # runtimelock.bases resolves every platform's base
        bases[platform] = runtime_base(resolved, client)
        release = releases[platform]
        if release is not None:  # the fixed wheel's Requires-Dist is the precompiled wheel's own
            runtimelock.check_fresh(locks[platform], requires_dist=requires_dist(release), base=facts[platform])
    return Prepared(locks, bases, releases, facts)


@record(kw_only=True)
class Delivery:
    """Where the written images go: pushed (`push`; `attester` set: signed and attested) or loaded into the engine,
    then smoke-tested with `smoke`."""

    push: bool
    smoke: bool
    attester: Attester | None = None


def build(
    config: Config,
    cache: Cache,
    prepared: Prepared,
    the_plan: ImagePlan,
    fixed_wheels: dict[Platform, Path],
    delivery: Delivery,
    client: docker.DockerClient,
    progress: Progress,
) -> LockedImageResult:
    """Download, plan, write and push (or load) every platform's image; then the shared tags and the smoke test.
    With --push, `delivery.attester` (carry.image.attest) writes each platform's SBOM and signs and attests what was
    pushed."""
    from carry.image import registry, registryhttp

    push, run_smoke, attester = delivery.push, delivery.smoke, delivery.attester
    digests = Digests(cache.root / "image-layers")
    plans, fetched = _plan_all(config, cache, prepared, the_plan, fixed_wheels, progress)
    outcomes: list[PlatformOutcome] = []
    pushed: dict[str, str] = {}
    duplicates = tuple(d for p in plans.values() for d in p.duplicates)
    notes = _layer_notes(plans, duplicates)
    if push:
        with registry.credentials(config.image.name, config.image.docker) as login:
            repo = registryhttp.Repository.of(config.image.name, login.auth, lambda line: progress.phase("retry", line))
            manifests = []
            for image in the_plan.images:
                started = time.monotonic()
                plan = plans[image.platform]
                progress.phase("push", f"{image.platform} -> {', '.join(image.refs)}")
                labels = prepared.labels(image.platform, image.labels)
                body, digest, layers, config_action = push_platform(
                    repo, client, plan, digests, labels, config, progress
                )
                manifest = pushorder.Manifest(image.platform, body, registryhttp.DOCKER_MANIFEST, image.refs)
                pushorder.put_platform(repo, manifest)  # by digest: the tags move last (pushorder)
                manifests.append(manifest)
                if attester is not None:
                    _attest(attester, repo, image, plan, digest, fixed_wheels, prepared, fetched)
                outcomes.append(
                    PlatformOutcome(
                        image.platform, image.refs, digest, tuple(layers), config_action, time.monotonic() - started
                    )
                )
            if the_plan.shared and not the_plan.complete:
                notes.append("shared tags left as they were: not every platform of image.platforms was built")
            shared = the_plan.shared if the_plan.complete else ()
            sign = (lambda digest: attester.index(repo, digest)) if attester is not None else None
            pushed = pushorder.finish(repo, manifests, shared, sign, progress)
            if run_smoke:
                outcomes = smoke_pushed(client, config, outcomes, plans, login, progress, the_plan.version)
    else:
        for image in the_plan.images:
            started = time.monotonic()
            labels = prepared.labels(image.platform, image.labels)
            before = engineimage.named(client, image.refs)
            image_id, layers = load_platform(
                client, plans[image.platform], digests, labels, config, image.refs, progress
            )
            text = None
            if run_smoke:
                progress.phase("smoke", f"{image.refs[0]} ({image.platform})")
                text = smoke(client, image.refs[0], plans[image.platform], image.platform is Platform.native())
            kept = engineimage.keep(client, image_id, image.refs, image.platform, the_plan.version, before)
            outcomes.append(
                PlatformOutcome(
                    image.platform,
                    image.refs,
                    image_id,
                    tuple(layers),
                    "loaded",
                    time.monotonic() - started,
                    text,
                    kept,
                )
            )
        if the_plan.shared:
            notes.append(
                "shared tags are made on --push: a registry holds one tag for several platforms, the "
                "local image store does not"
            )
    if push and attester is not None:
        notes += attester.notes()
    return LockedImageResult(
        tuple(outcomes), pushed, the_plan.shared, tuple(notes), duplicates, attester if push else None
    )


def _plan_all(
    config: Config,
    cache: Cache,
    prepared: Prepared,
    the_plan: ImagePlan,
    fixed_wheels: dict[Platform, Path],
    progress: Progress,
) -> tuple[dict[Platform, PlatformPlan], dict[Platform, dict[str, Path]]]:
    """Each platform's locked wheels downloaded and its layers planned: (plans, the wheel files fetched)."""
    store = Store.from_env(cache.root)
    plans: dict[Platform, PlatformPlan] = {}
    fetched: dict[Platform, dict[str, Path]] = {}
    for image in the_plan.images:
        platform = image.platform
        lock = prepared.locks[platform]
        if prepared.releases[platform] is None:  # no precompiled wheel: the fixed wheel's own Requires-Dist
            runtimelock.check_fresh(
                lock, requires_dist=requires_dist(fixed_wheels[platform]), base=prepared.facts[platform]
            )
        wheels = fetched[platform] = fetch_wheels(lock, store, progress, cache.scratch)
        base_ref, base = prepared.bases[platform]
        started = time.monotonic()
        plans[platform] = plan_platform(
            config, platform, lock, wheels, fixed_wheels[platform], prepared.releases[platform], base_ref, base
        )
        progress.phase(
            "plan",
            f"{platform}: {len(lock.packages)} locked wheel(s) + {fixed_wheels[platform].name}: "
            + ", ".join(f"{layer.name} {layer.files} files" for layer in plans[platform].layers)
            + f" ({time.monotonic() - started:.1f}s)",
        )
    return plans, fetched


def _layer_notes(plans: dict[Platform, PlatformPlan], duplicates: tuple[str, ...]) -> list[str]:
    """What the layer plans kept once: files stored in two layers, paths two locked wheels install."""
    notes: list[str] = []
    if duplicates:
        notes.append(f"{len(duplicates)} file(s) stored in two layers: {', '.join(duplicates[:3])}")
    for platform, plan in plans.items():
        for layer in plan.layers:
            if layer.overwritten:
                notes.append(
                    f"{platform} {layer.name}: {len(layer.overwritten)} path(s) installed by two locked "
                    f"wheels, kept once (the wheel named like the path's package, else the later by "
                    f"name), e.g. {layer.overwritten[0]}"
                )
    return notes


def _attest(
    attester: Attester,
    repo: Repository,
    image: PlatformImage,
    plan: PlatformPlan,
    digest: str,
    fixed_wheels: dict[Platform, Path],
    prepared: Prepared,
    fetched: dict[Platform, dict[str, Path]],
) -> None:
    """The pushed platform manifest's SBOM, signature and attestations (carry.image.attest)."""
    from carry.image.attest import Installed

    facts = attester.facts(
        image.platform,
        image.labels,
        fixed_wheels[image.platform],
        prepared.releases[image.platform],
        plan.base_ref,
        plan.base,
        Installed(lock=prepared.locks[image.platform], wheels=fetched[image.platform]),
    )
    attester.platform(repo, facts, digest, locked=True)

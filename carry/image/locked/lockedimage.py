"""The locked, layered image (build.yaml `image.lock`): carry writes the layers itself, nothing of the target CPU runs,
no build context is sent (docs/images.md: "The locked image"). Each layer is a deterministic tar of the lock's wheels,
pushed over the registry's HTTP API or, without --push, streamed into `docker load`:

  base layers  the runtime base image's own, unchanged
  L1 venv      /opt/venv (pyvenv.cfg, python links, empty site-packages), /etc/carry/runtime.env, the entrypoint
  L2 nvidia    locked wheels named nvidia-* and cuda-*
  L3 torch     torch and its kin (TORCH_KIN)
  L4 deps      every other locked wheel
  L5 release   the upstream wheel the fixed wheel was made from (build.precompiled's pin)
  L6 fixed     the difference to installing the fixed wheel instead (changed and new files, the new dist-info,
               whiteouts for what it replaces); without a precompiled wheel L5 is absent and L6 is the wheel

Here: `prepare` and `build`, over layerplan (planned), layerwrite (pushed or loaded) and smoketest."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carry.config import Config
from carry.image import publish
from carry.image.layerpush import Digests, LayerOutcome, size_text
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
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.download import Store
from carry.util.errors import BadInput, Failed
from carry.util.record import record

if TYPE_CHECKING:
    import docker

    from carry.image.locked.registrycache import Facts, Reuse
    from carry.image.publish import Attester
    from carry.image.registry import Login
    from carry.image.vocabulary import ImagePlan


# -- the whole image -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LockedImageResult:
    platforms: tuple[PlatformOutcome, ...]
    pushed: dict[str, str]  # ref -> digest
    shared: tuple[str, ...]
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
            if outcome.record:
                rows.append(f"  record: {outcome.record.line(outcome.platform)}")
        if self.platforms and self.platforms[0].record is not None:
            last = self.platforms[-1]
            trust = f" ({size_text(last.trust_sent)} of it signatures and attestations)" if last.trust_sent else ""
            rows.append(f"  registry: {size_text(last.sent)} sent{trust}, {size_text(last.received)} read in all")
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
                    "smoke_record": o.smoke_record,
                    "engine": o.kept.to_json() if o.kept else None,
                    "record": o.record.to_json() if o.record else None,
                    "registry": {"sent": o.sent, "received": o.received, "trust": o.trust_sent},
                    "layers": [
                        {
                            **{key: getattr(layer, key) for key in ("name", "action", "files", "key", "source", "why")},
                            **layer.written.to_json(),
                        }
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
    known: Callable[[], dict] | None = None,
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
        release = releases[platform] = release_wheel(config, cache, platform)
        if release is not None:  # a changed Requires-Dist is known before any base is pulled or derived
            runtimelock.check_requires(locks[platform], requires_dist(release))
    # `known()`: the bases the previous images' records name (the registry read only once the locks hold)
    facts = runtimelock.bases(config, platforms, cache, known() if known is not None else None)
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
    then smoke-tested with `smoke` (`smoke_mode`: auto, or full: always pulled and run); `previous`: each platform's
    previous image in the registry (registrycache.find), whose record the push reuses."""

    push: bool
    smoke: bool
    attester: Attester | None = None
    smoke_mode: str = "auto"
    previous: dict | None = None  # Platform -> registrycache.Previous
    discard_wheels: bool = False  # the locked wheels downloaded for a platform removed once its layers are pushed


def build(
    config: Config,
    cache: Cache,
    prepared: Prepared,
    the_plan: ImagePlan,
    fixed_wheels: dict[Platform, Path],
    delivery: Delivery,
    client: docker.DockerClient,
) -> LockedImageResult:
    """Download, plan, write and push (or load) every platform's image; then the shared tags and the smoke test. With
    --push, `delivery.attester` signs and attests what was pushed, and each platform's record goes beside it."""
    digests = Digests(cache.root / "image-layers")
    job = _Job(
        config=config, cache=cache, prepared=prepared, the_plan=the_plan, fixed_wheels=fixed_wheels, client=client
    )
    if delivery.push:
        return _push_all(job, delivery)
    plans = {image.platform: _plan(job, image.platform, None)[0] for image in the_plan.images}
    duplicates = tuple(d for p in plans.values() for d in p.duplicates)
    _say_layers(plans, duplicates)
    outcomes: list[PlatformOutcome] = []
    for image in the_plan.images:
        started = time.monotonic()
        labels = prepared.labels(image.platform, image.labels)
        before = engineimage.named(client, image.refs)
        image_id, layers = load_platform(client, plans[image.platform], digests, labels, config, image.refs)
        text = None
        if delivery.smoke:
            reporter.phase("smoke", f"{image.refs[0]} ({image.platform})")
            text = smoke(client, image.refs[0], plans[image.platform], image.platform is Platform.native())
        kept = engineimage.keep(client, image_id, image.refs, image.platform, the_plan.version, before)
        outcomes.append(
            PlatformOutcome(
                image.platform, image.refs, image_id, tuple(layers), "loaded", time.monotonic() - started, text, kept
            )
        )
    if the_plan.shared:
        reporter.note(
            "shared tags are made on --push: a registry holds one tag for several platforms, the "
            "local image store does not"
        )
    return LockedImageResult(tuple(outcomes), {}, the_plan.shared, duplicates, None)


@record(kw_only=True)
class _Job:
    """What every step of one push shares."""

    config: Config
    cache: Cache
    prepared: Prepared
    the_plan: ImagePlan
    fixed_wheels: dict
    client: Any  # docker.DockerClient


def _push_all(job: _Job, delivery: Delivery) -> LockedImageResult:
    """Every platform's image pushed and handed to the publish stage, its smoke test and record, then the tags."""
    config, cache, prepared, the_plan = job.config, job.cache, job.prepared, job.the_plan
    fixed_wheels, client = job.fixed_wheels, job.client
    digests = Digests(cache.root / "image-layers")
    from carry.image import registry, registryhttp
    from carry.image.locked import registrycache

    attester = delivery.attester
    with registry.credentials(config.image.name, config.image.docker) as login:
        repo = registryhttp.Repository.of(config.image.name, login.auth, retries_said=True)
        previous = delivery.previous or {}
        reuse = registrycache.Reuse(repo, digests, previous)
        plans: dict[Platform, PlatformPlan] = {}
        fetched: dict[Platform, dict[str, Path]] = {}
        outcomes: list[PlatformOutcome] = []
        added: list[Path] = []
        stage = publish.Stage(repo, attester, locked=True)  # counts the signatures' and attestations' bytes apart
        if not delivery.discard_wheels:  # every lock's wheels checked before anything is sent
            for image in the_plan.images:
                plans[image.platform], fetched[image.platform] = _plan(job, image.platform, reuse, added)
        for image in the_plan.images:
            started = time.monotonic()
            if image.platform not in plans:  # --discard-wheels: one platform's wheels on disk at a time
                plans[image.platform], fetched[image.platform] = _plan(job, image.platform, reuse, added)
            plan = plans[image.platform]
            reporter.phase("push", f"{image.platform} -> {', '.join(image.refs)}")
            labels = prepared.labels(image.platform, image.labels)
            body, digest, layers, config_action = push_platform(repo, client, plan, reuse, labels, config)
            stage.platform(
                publish.Manifest(image.platform, body, registryhttp.DOCKER_MANIFEST, image.refs),
                publish.PlatformFacts(
                    platform=image.platform,
                    labels=image.labels,
                    fixed=fixed_wheels[image.platform],
                    release=prepared.releases[image.platform],
                    base_ref=plan.base_ref,
                    base=plan.base,
                    lock=prepared.locks[image.platform],
                    wheels=fetched[image.platform],
                ),
            )
            outcomes.append(
                PlatformOutcome(
                    image.platform, image.refs, digest, tuple(layers), config_action, time.monotonic() - started
                )
            )
            if delivery.discard_wheels:
                _discard(added, image.platform)
        duplicates = tuple(d for p in plans.values() for d in p.duplicates)
        _say_layers(plans, duplicates)
        if the_plan.shared and not the_plan.complete:
            reporter.note("shared tags left as they were: not every platform of image.platforms was built")
        # the smoke test (of the images by digest) and each record before any tag moves: a tag names only an image
        # that passed, with its record beside it (carry.image.publish)
        if delivery.smoke:
            outcomes = _smoke_all(job, outcomes, plans, login, delivery, reuse)
        outcomes = [_record(job, stage, outcome, plans[outcome.platform], reuse) for outcome in outcomes]
        pushed = stage.tags(the_plan.shared if the_plan.complete else ())
        others = {id(p.repo): p.repo for p in previous.values() if p.repo is not None and p.repo is not repo}
        sent = repo.sent + sum(other.sent for other in others.values())
        received = repo.received + sum(other.received for other in others.values())
        outcomes = [dataclasses.replace(o, sent=sent, received=received, trust_sent=stage.trust_sent) for o in outcomes]
    return LockedImageResult(tuple(outcomes), pushed, the_plan.shared, duplicates, attester)


def _smoke_all(
    job: _Job,
    outcomes: list[PlatformOutcome],
    plans: dict[Platform, PlatformPlan],
    login: Login,
    delivery: Delivery,
    reuse: Reuse,
) -> list[PlatformOutcome]:
    """Each platform smoke-tested as smoketest.choose says: pulled back and run, or its changed files checked."""
    from carry.image.locked import smoketest

    client = job.client
    previous = delivery.previous or {}
    light: list[PlatformOutcome] = []
    full: list[PlatformOutcome] = []
    for outcome in outcomes:
        unchanged = [layer.written.diff_id for layer in outcome.layers if layer.action != "pushed"]
        holds = engineimage.holds(client, job.config.image.name, outcome.platform, unchanged)
        choice = smoketest.choose(
            delivery.smoke_mode, outcome, plans[outcome.platform], previous.get(outcome.platform), holds
        )
        reporter.phase("smoke", f"{outcome.platform}: {choice.mode} ({choice.why})")
        (light if choice.mode == smoketest.LIGHT else full).append(outcome)
    done = {}
    if full:
        for outcome in smoke_pushed(client, job.config, full, plans, login, job.the_plan.version):
            done[outcome.platform] = dataclasses.replace(
                outcome, smoke_record=smoketest.full_record(outcome, outcome.smoke or "")
            )
    for outcome in light:
        facts = [found for _, found, _ in _layer_facts(outcome, plans[outcome.platform], reuse) if found is not None]
        text, made = smoketest.light(client, plans[outcome.platform], outcome, previous[outcome.platform], facts)
        reporter.phase("smoke", text)
        done[outcome.platform] = dataclasses.replace(outcome, smoke=text, smoke_record=made)
    return [done[outcome.platform] for outcome in outcomes]


def _layer_facts(
    outcome: PlatformOutcome, plan: PlatformPlan, reuse: Reuse
) -> list[tuple[LayerOutcome, Facts | None, bytes | None]]:
    """Per layer (base aside): its facts and their blob, from its plan, else from the previous image's record."""
    from carry.image.locked import registrycache

    site = (plan.fixed.dist_info.rsplit("/", 1)[0]) if plan.fixed.dist_info else ""
    planned = {layer.key: layer for layer in plan.layers if layer.planned}
    found: list[tuple[LayerOutcome, registrycache.Facts | None, bytes | None]] = []
    for layer in outcome.layers:
        if layer.name == "base":
            continue
        if layer.key in planned:
            facts = registrycache.facts_of(planned[layer.key].items, site, planned[layer.key].wheels)
            found.append((layer, facts, facts.blob()))
            continue
        entry = reuse.entry(outcome.platform, layer.key)
        previous = reuse.previous.get(outcome.platform)
        blob = previous.facts_blob(entry) if previous is not None and entry is not None else None
        found.append((layer, registrycache.Facts.from_blob(blob) if blob else None, blob))
    return found


def _record(
    job: _Job, stage: publish.Stage, outcome: PlatformOutcome, plan: PlatformPlan, reuse: Reuse
) -> PlatformOutcome:
    """The platform's record beside its pushed manifest (registrycache.push_record): after the smoke test, so that a
    record says the image passed it (or that none ran)."""
    from carry.image import registryhttp
    from carry.image.locked import imagewheel, registrycache

    facts: dict[str, bytes] = {}
    by_key: dict[str, str] = {}
    for layer, _, blob in _layer_facts(outcome, plan, reuse):
        if blob is not None:
            digest = registryhttp.digest_of(blob)
            facts[digest], by_key[layer.key] = blob, digest
    entries = tuple(
        registrycache.Entry(
            layer.name,
            layer.key,
            layer.written.digest,
            layer.written.diff_id,
            layer.written.size,
            layer.written.tar_size,
            layer.written.installed,
            layer.files,
            by_key.get(layer.key, ""),
        )
        for layer in outcome.layers
    )
    found = job.prepared.facts.get(outcome.platform)
    base = found.base.record(plan.base) if found is not None and found.base is not None else None
    fixed = job.fixed_wheels[outcome.platform]
    wheel = {"file": fixed.name, "patches": imagewheel.recorded_series(fixed, job.config.patches_dir)}
    made = registrycache.Record(outcome.digest, str(outcome.platform), entries, base, wheel, outcome.smoke_record)
    attached = registrycache.push_record(stage, made, facts)
    reporter.phase("record", attached.line(outcome.platform))
    return dataclasses.replace(outcome, record=attached)


def _plan(
    job: _Job, platform: Platform, reuse: Reuse | None, added: list[Path] | None = None
) -> tuple[PlatformPlan, dict[str, Path]]:
    """A platform's layers planned, with the wheel files of its lock; with `reuse`, layers the registry has are planned
    by key, no wheel read, else the lock's wheels are fetched (new ones listed in `added`)."""
    config, cache, prepared, fixed_wheels = job.config, job.cache, job.prepared, job.fixed_wheels
    store = Store.from_env(cache.root)
    lock = prepared.locks[platform]
    if prepared.releases[platform] is None:  # no precompiled wheel: the fixed wheel's own Requires-Dist
        runtimelock.check_fresh(
            lock, requires_dist=requires_dist(fixed_wheels[platform]), base=prepared.facts[platform]
        )
    base_ref, base = prepared.bases[platform]
    started = time.monotonic()
    inputs = (fixed_wheels[platform], prepared.releases[platform], base_ref, base)
    shallow = plan_platform(config, platform, lock, None, *inputs) if reuse is not None else None
    known = _recorded_wheels(shallow, reuse, platform) if shallow is not None and reuse is not None else None
    if shallow is not None and known is not None:
        plan, fetched = shallow, _sbom_wheels(lock, store, known)
        why = "their layers are in the registry: no wheel read"
    else:
        fetched = fetch_wheels(lock, store, cache.scratch, added)
        plan = plan_platform(config, platform, lock, fetched, *inputs)
        why = f"{len(lock.packages)} locked wheel(s) read"
    reporter.phase(
        "plan",
        f"{platform}: {why} + {fixed_wheels[platform].name}: "
        + ", ".join(f"{layer.name} {layer.files} files" for layer in plan.layers if layer.planned)
        + f" ({time.monotonic() - started:.1f}s)",
    )
    return plan, fetched


def _discard(added: list[Path], platform: Platform) -> None:
    """--discard-wheels: the locked wheels this run downloaded for `platform`, removed once its layers are pushed
    (nothing here reads them again: a CI runner's disk holds one platform's wheels at a time)."""
    import shutil

    total = 0
    for path in added:
        total += path.stat().st_size if path.exists() else 0
        shutil.rmtree(path.parent, ignore_errors=True)
    if added:
        reporter.phase(
            "download", f"{platform}: {len(added)} wheel(s) this run downloaded, {total / 1e9:.2f} GB, removed"
        )
    added.clear()


def _recorded_wheels(plan: PlatformPlan, reuse: Reuse, platform: Platform) -> dict[str, tuple[str, str]] | None:
    """name -> (file, sha256) of every locked wheel, when each locked wheels' layer is in the registry with the
    previous image's facts of it; None when one must be written (its wheels are then read)."""
    found: dict[str, tuple[str, str]] = {}
    previous = reuse.previous.get(platform)
    for layer in plan.layers:
        if layer.planned:
            continue
        entry = reuse.entry(platform, layer.key)
        if entry is None or previous is None or reuse.find(platform, layer.name, layer.key) is None:
            return None
        facts = previous.facts(entry)
        if facts is None:
            return None
        found.update({name: (file, sha) for name, file, sha in facts.wheels})
    return found


def _sbom_wheels(lock: runtimelock.Lock, store: Store, recorded: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """The wheel file of each locked package as the record names it, each sha256 one the lock lists."""
    wheels = {}
    for package in lock.packages:
        file, sha = recorded.get(package.name, ("", ""))
        if f"sha256:{sha}" not in package.hashes:
            raise Failed(
                f"the registry's record names {file or 'no wheel'} for {package.name}=={package.version}, whose "
                f"sha256 the lock does not list; the record is not this lock's"
            )
        wheels[package.name] = store.root / sha / file
    return wheels


def _say_layers(plans: dict[Platform, PlatformPlan], duplicates: tuple[str, ...]) -> None:
    """Notes on what the layer plans kept once: files stored in two layers, paths two locked wheels install."""
    if duplicates:
        reporter.note(f"{len(duplicates)} file(s) stored in two layers: {', '.join(duplicates[:3])}")
    for platform, plan in plans.items():
        for layer in plan.layers:
            if layer.overwritten:
                reporter.note(
                    f"{platform} {layer.name}: {len(layer.overwritten)} path(s) installed by two locked "
                    f"wheels, kept once (the wheel named like the path's package, else the later by "
                    f"name), e.g. {layer.overwritten[0]}"
                )

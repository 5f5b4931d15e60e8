"""The container image: one BuildKit build per platform (carry.image.buildkit.container), tags and labels from VERSION
and the series, each platform pushed from the engine by digest (enginepush), then the manifest lists and the tags
(carry.image.publish). One platform: its image gets every tag. Several: each platform's image is tagged
`<VERSION>-<arch>` and every shared tag becomes, on push, a manifest list of them (the local image store holds one
platform per tag)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carry.arch import ArchList
from carry.config import TAG_RE, Config
from carry.config.reader import public_url
from carry.image import publish
from carry.image.buildkit import container, enginepush, layercache
from carry.image.buildkit.container import Builder, StageBuild
from carry.image.vocabulary import LABEL_PREFIX, WHEEL_LABEL, ImagePlan, PlatformImage, own_tag
from carry.platforms import Platform
from carry.source.apply import CheckReport
from carry.source.series import Series
from carry.util import prog, reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import temp_dir
from carry.util.record import record

if TYPE_CHECKING:
    import docker

    from carry.image.publish import Attester, Wheel
    from carry.image.registry import Login


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """`image` flags, resolved once."""

    push: bool
    extra_tags: tuple[str, ...]
    platforms: tuple[Platform, ...]
    hermetic: bool
    wheelhouse: Path | None
    cache: tuple[layercache.CacheSpec, ...] = ()  # --cache-from and --cache-to, parsed
    attest: tuple[tuple[str, str], ...] = publish.DEFAULT  # --attest, resolved (carry.trust.kinds.chosen)

    def __post_init__(self) -> None:
        for tag in self.extra_tags:
            if not TAG_RE.fullmatch(tag):
                raise BadInput(f"--tag {tag!r} is not a valid tag; use letters, digits, '_', '.', '-' (at most 128)")


@dataclasses.dataclass(frozen=True)
class ImageResult:
    plan: ImagePlan
    image_ids: dict[Platform, str]
    pushed: dict[str, str]  # ref -> digest
    trust: Any = None  # carry.image.attest.Attester: the signatures and attestations pushed

    def lines(self) -> list[str]:
        """What was signed and attached, then `ref  digest  platforms` for each tag made, platform images first."""
        rows = self.trust.lines() if self.trust is not None else []
        for image in self.plan.images:
            for ref in image.refs:
                rows.append("  ".join(filter(None, (ref, self.pushed.get(ref, ""), str(image.platform)))))
        everything = ", ".join(str(i.platform) for i in self.plan.images)
        rows += [f"{ref}  {self.pushed[ref]}  {everything}" for ref in self.plan.shared if ref in self.pushed]
        return rows


def render_tags(config: Config, version: str, series: Series, cuda: str) -> tuple[str, ...]:
    fields = dict(version=version, base_short=config.upstream.commit[:12], cuda=cuda, series_short=series.hash[:12])
    if cuda == "none" and any("{cuda}" in template for template in config.image.tags):
        raise BadInput(
            f"{config.path}: image.tags uses {{cuda}}, but no nvcc here tells the CUDA release "
            f"(CUDA_HOME, /usr/local/cuda, PATH); install the CUDA toolkit or PyPI's nvidia-cuda-nvcc "
            f"where carry runs, or drop {{cuda}} from image.tags"
        )
    return tuple(dict.fromkeys(template.format(**fields) for template in config.image.tags))


def cuda_tag(nvcc_version: str | None) -> str:
    """`130` from nvcc's `release 13.0, V13.0.88` line."""
    if nvcc_version and "release " in nvcc_version:
        release = nvcc_version.split("release ", 1)[1].split(",", 1)[0]
        return release.replace(".", "")
    return "none"


def platforms_to_build(config: Config, options: ImageOptions) -> tuple[Platform, ...]:
    """--platform, else image.platforms, else this machine's own."""
    configured = tuple(target.platform for target in config.image.platforms)
    return options.platforms or configured or (Platform.native(),)


@record(kw_only=True)
class Subject:
    """What the images hold, resolved once: the patched tree (`report`), VERSION, the distribution name (None: the build
    stage's wheel names it), the CUDA tag, the upstream's version and `created` (never the clock)."""

    report: CheckReport
    series: Series
    version: str
    dist_name: str | None
    cuda: str
    created: str
    upstream_version: str | None = None


def created_at(mirror: Path, commit: str, environ: Mapping[str, str]) -> str:
    """The image's `created` (org.opencontainers.image.created, the locked image's config): $SOURCE_DATE_EPOCH when
    set, else the pinned commit's committer date; the same for the same pin, on every machine and every rerun."""
    from carry.source import git

    epoch = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        if not epoch.isdigit():
            raise BadInput(f"SOURCE_DATE_EPOCH={epoch!r} is not a count of seconds since 1970; unset it or fix it")
        seconds = int(epoch)
    else:
        try:
            seconds = int(git.run(mirror, "show", "-s", "--format=%ct", commit))
        except (git.GitError, ValueError) as exc:
            raise Failed(f"the committer date of {commit[:12]} is not readable in {mirror}: {exc}") from None
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def plan(config: Config, subject: Subject, arches: dict[Platform, ArchList], options: ImageOptions) -> ImagePlan:
    """Tags, labels and build args per platform; `arches` holds each platform's (--arch, else its own)."""
    report, series, version, dist_name = subject.report, subject.series, subject.version, subject.dist_name
    if report.tree is None:
        raise Failed("the series does not apply; run `check` for details")
    platforms = platforms_to_build(config, options)
    configured = {target.platform for target in config.image.platforms}
    several = len(configured | set(platforms)) > 1
    tags = render_tags(config, version, series, subject.cuda) + options.extra_tags
    shared = tuple(dict.fromkeys(f"{config.image.name}:{tag}" for tag in tags))
    images = []
    for platform in platforms:
        own_arches = arches[platform]
        refs = (f"{config.image.name}:{own_tag(version, platform)}",) if several else shared
        labels = _labels(config, subject, own_arches, platform)
        args = container.stage_args(config, platform, str(own_arches), options.hermetic, subject.upstream_version)
        images.append(PlatformImage(platform=platform, arches=own_arches, refs=refs, labels=labels, build_args=args))
    complete = configured <= set(platforms)
    return ImagePlan(tuple(images), shared if several else (), complete, report.tree, version, dist_name is not None)


def _labels(config: Config, subject: Subject, arches: ArchList, platform: Platform) -> dict[str, str]:
    report, series, version, dist_name = subject.report, subject.series, subject.version, subject.dist_name
    labels = {
        **config.image.labels,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": report.base,
        "org.opencontainers.image.source": public_url(config.upstream.url),
        "org.opencontainers.image.created": subject.created,
        f"{LABEL_PREFIX}.version": version,
        f"{LABEL_PREFIX}.upstream.url": public_url(config.upstream.url),
        f"{LABEL_PREFIX}.upstream.pr": str(config.upstream.pr or ""),
        f"{LABEL_PREFIX}.upstream.commit": report.base,
        f"{LABEL_PREFIX}.series.hash": series.hash,
        f"{LABEL_PREFIX}.patches": ",".join(p.name for p in series.patches),
        f"{LABEL_PREFIX}.cuda_arches": str(arches),
        f"{LABEL_PREFIX}.platform": str(platform),
        f"{LABEL_PREFIX}.tree": report.patched_tree(),
    }
    return {**labels, WHEEL_LABEL: dist_name} if dist_name else labels


def check_options(config: Config, builder: Builder, options: ImageOptions) -> None:
    """What this engine cannot do with the flags given, and a bad $CARRY_REMOTE_CACHE_URL, before any work."""
    from carry.wheelbuild import compilecache, distbuild

    layercache.check(options.cache, builder.buildx, builder.docker, len(platforms_to_build(config, options)))
    compilecache.remote_setting(config, os.environ)
    distbuild.setting(config, os.environ)


def _cache_flags(
    config: Config, options: ImageOptions, builder: Builder, image: PlatformImage, version: str
) -> layercache.CacheFlags:
    """--cache-from/--cache-to for one platform; `inline` lives in its own image, the tag naming VERSION."""
    own = next((ref for ref in image.refs if version in ref.rsplit(":", 1)[1]), image.refs[0])
    return layercache.flags(options.cache, builder.buildx, config.image.name, own, version, image.platform)


@record(kw_only=True)
class Sources:
    """What the build context is assembled from: the upstream `mirror` and its build `requirements`."""

    mirror: Path
    requirements: list[str]


def build(
    config: Config,
    cache: Cache,
    inputs: Sources,
    the_plan: ImagePlan,
    options: ImageOptions,
    builder: Builder,
    attester: Attester | None = None,
) -> ImageResult:
    """Build every platform's image, then push each and join the shared tags into manifest lists. The registry login is
    made once, before the builds: the push needs it, and so do the builds' cache imports and exports."""
    from carry.image import registry

    log = cache.logs / f"image-{the_plan.tree[:12]}.log"
    log.unlink(missing_ok=True)
    needs_login = options.push or bool(options.cache)
    with registry.credentials(config.image.name, builder.docker) if needs_login else contextlib.nullcontext() as login:
        with temp_dir(cache.scratch, "image-") as scratch:
            context = scratch / "context"
            reporter.phase("context", f"project, carry, bundle of {config.upstream.commit[:12]}")
            _assemble(config, cache, inputs, the_plan, options, context)
            access = container.stage_access(config, scratch, options.hermetic)
            if not the_plan.named:
                the_plan = the_plan.with_distribution(_built_distribution(the_plan, builder, access, context, log))
            hermetic: dict = {}
            for image in the_plan.images:
                reporter.phase(
                    "build",
                    f"{image.platform}{image.platform.where()}, arches {image.arches} -> "
                    f"{', '.join(image.refs)}; log {log}",
                )
                caching = _cache_flags(config, options, builder, image, the_plan.version)
                env = login.cli_env() if options.cache and login is not None else None
                output = StageBuild(
                    image.platform,
                    container.RUNTIME_STAGE,
                    {**image.build_args, **dict(caching.build_args)},
                    access.network,
                    image.labels,
                    image.refs,
                    cache_args=caching.args,
                ).run(builder, access.secret, context, log, env)
                if options.cache:
                    for note in layercache.outcome(output, caching.sources):
                        reporter.phase("layer cache", f"{image.platform}: {note}")
                if attester is not None and options.hermetic:
                    hermetic[image.platform] = _hermetic_inputs(image, access, builder, context, log, scratch)
        client = registry.client()
        ids = {image.platform: client.images.get(image.refs[0]).id for image in the_plan.images}
        pushed: dict[str, str] = {}
        if options.push:
            assert login is not None  # needs_login: the push's credentials were made before the builds
            pushed = _push(config, cache, the_plan, client, login, attester, hermetic)
    if the_plan.shared and not (options.push and the_plan.complete):
        reporter.note(_shared_tags_note(config, the_plan, options))
    return ImageResult(the_plan, ids, pushed, attester if options.push else None)


def _push(
    config: Config,
    cache: Cache,
    the_plan: ImagePlan,
    client: docker.DockerClient,
    login: Login,
    attester: Attester | None,
    hermetic: dict,
) -> dict[str, str]:
    """Each platform's image pushed from the engine and handed to the publish stage; then the tags. ref -> digest."""
    from carry.image import registryhttp
    from carry.image.layerpush import Digests

    repo = registryhttp.Repository.of(config.image.name, login.auth, retries_said=True)
    digests = Digests(cache.root / "image-layers")
    stage = publish.Stage(repo, attester)
    for image in the_plan.images:
        reporter.phase("push", f"{image.refs[0]} ({image.platform})")
        manifest = enginepush.push(repo, client, image.refs[0], image.platform, image.refs, digests)
        stage.platform(manifest, functools.partial(_subject, config, client, image, hermetic.get(image.platform)))
    return stage.tags(the_plan.shared if the_plan.complete else ())


def _assemble(
    config: Config, cache: Cache, inputs: Sources, the_plan: ImagePlan, options: ImageOptions, context: Path
) -> None:
    """The build context in `context`: project, carry, the bundle; with --hermetic the wheelhouse too."""
    platforms = tuple(i.platform for i in the_plan.images)
    container.assemble_context(config, cache, inputs.mirror, context, inputs.requirements, platforms)
    if options.hermetic:
        container.hermetic_wheelhouse(
            config, cache, platforms, inputs.requirements, options.wheelhouse, context / "wheelhouse"
        )


def _hermetic_inputs(
    image: PlatformImage, access: container.StageAccess, builder: Builder, context: Path, log: Path, scratch: Path
) -> tuple[Wheel | None, dict[tuple[str, str], Wheel]]:
    """What a hermetic build's SBOM needs from the build context before it is removed: the fixed wheel (the build
    stage's, exported from BuildKit's cache) and the wheelhouse the runtime stage installed from."""
    exported = scratch / f"wheel-{image.platform.tag}"
    StageBuild(image.platform, container.WHEEL_STAGE, image.build_args, access.network, output_dir=exported).run(
        builder, access.secret, context, log
    )
    wheels = sorted(exported.glob("*.whl"))
    return (publish.wheel_of(wheels[0]) if len(wheels) == 1 else None), publish.wheel_index(context / "wheelhouse")


def _subject(
    config: Config,
    client: docker.DockerClient,
    image: PlatformImage,
    hermetic: tuple[Wheel | None, dict[tuple[str, str], Wheel]] | None,
) -> publish.PlatformFacts:
    """What a Dockerfile-built platform image's attestations say; with --hermetic its SBOM too (without, pip resolved
    the wheels inside BuildKit and carry knows no hash for an SBOM)."""
    base_ref = config.target(image.platform).runtime_image or config.image.runtime_image or ""
    try:
        base = client.api.inspect_image(base_ref) if base_ref else {}
    except Exception:  # docker.errors.ImageNotFound: a base BuildKit pulled itself
        base = {}
    fixed, engine = publish.Wheel(image.labels.get(f"{LABEL_PREFIX}.wheel", ""), "", "", ""), None
    why = (
        "without --hermetic the Dockerfile's runtime stage installs wheels pip resolves inside BuildKit, whose "
        "sha256 carry does not know (build with --hermetic, or set image.lock)"
    )
    if hermetic is not None and hermetic[0] is None:
        why = "the build stage did not export exactly one wheel"
    elif hermetic is not None and hermetic[0] is not None:
        fixed, engine = hermetic[0], (client, image.refs[0], hermetic[1])
    return publish.PlatformFacts(
        platform=image.platform,
        labels=image.labels,
        fixed=fixed,
        base_ref=base_ref,
        base=base,
        engine=engine,
        no_sbom=why,
    )


def _built_distribution(
    the_plan: ImagePlan, builder: Builder, access: container.StageAccess, context: Path, log: Path
) -> str:
    """The distribution name of the wheel the first platform's build stage makes (its `wheel` stage exported; the
    runtime stage then reuses that build from BuildKit's cache): for an upstream whose pyproject.toml names none."""
    image = the_plan.images[0]
    exported = context.parent / "exported"
    reporter.phase("wheel", f"{image.platform}: the build stage's wheel names the distribution (no [project] name)")
    StageBuild(image.platform, container.WHEEL_STAGE, image.build_args, access.network, output_dir=exported).run(
        builder, access.secret, context, log
    )
    wheels = sorted(exported.glob("*.whl"))
    if len(wheels) != 1:
        raise Failed(f"the build stage exported {len(wheels)} wheels, expected 1; log: {log}")
    name = wheels[0].name.split("-", 1)[0]
    reporter.phase("wheel", f"{wheels[0].name}: {WHEEL_LABEL}={name}")
    return name


def _shared_tags_note(config: Config, the_plan: ImagePlan, options: ImageOptions) -> str:
    tags = ", ".join(ref.rsplit(":", 1)[1] for ref in the_plan.shared)
    if not options.push:
        return (
            f"shared tags ({tags}) are made on --push: a registry holds one tag for several platforms, the "
            f"local image store does not"
        )
    missing = {t.platform for t in config.image.platforms} - {i.platform for i in the_plan.images}
    return (
        f"shared tags ({tags}) left as they were: {', '.join(sorted(map(str, missing)))} not built in this run; "
        f"run `{prog.command('manifest')}` once every platform's image is pushed"
    )


# -- manifest lists for images pushed by separate runs ---------------------------------------------------------


def join_pushed(
    config: Config,
    version: str,
    shared: tuple[str, ...],
    platforms: tuple[Platform, ...],
    builder: Builder,
    attester: Attester | None = None,
) -> dict[str, str]:
    """Every shared tag made a manifest list of the platforms' own images, signed with `attester` first."""
    from carry.image import registry, registryhttp

    sources = {platform: f"{config.image.name}:{own_tag(version, platform)}" for platform in platforms}
    with registry.credentials(config.image.name, builder.docker) as login:
        repo = registryhttp.Repository.of(config.image.name, login.auth, retries_said=True)
        manifests = []
        for platform, ref in sources.items():
            found = publish.pushed_platform(repo, publish.tag_of(ref), platform)
            if found is None:
                raise Failed(
                    f"{ref} is not in the registry for {platform}; push it first "
                    f"(`{prog.command('image', '--platform', str(platform), '--push')}`)"
                )
            manifests.append(found)
        reporter.phase("manifest", f"{', '.join(shared)} -> {', '.join(sources.values())}")
        return publish.Stage(repo, attester).tags(shared, manifests)

"""carry's command line (`carry` when installed, `python build.py` from a checkout): parse flags, call the
`carry` modules, print.

Each command imports what it uses when it runs, so `check` and `version` do not pay for the image, gate and
registry modules (and their libraries) at start-up.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, overload

import click

from carry.util.errors import CarryError
from carry.util.progress import Progress

if TYPE_CHECKING:
    from collections.abc import Iterable

    from carry.commands import Session
    from carry.platforms import Platform

TEST_TIMEOUT_S = 900  # seconds one command of build.tests may run (`test`, `prove`)
# The path types, made once: each click.Path asks gettext for its name when made (a few locale files looked up)
A_FILE = click.Path(path_type=Path, dir_okay=False)
A_DIR = click.Path(path_type=Path, file_okay=False)
AN_EXISTING_DIR = click.Path(path_type=Path, file_okay=False, exists=True)


class Context:
    """What every command needs: the config path and, on first use, the loaded config."""

    def __init__(self, config_path: Path):
        self.config_path = config_path

    def session(self) -> Session:
        from carry.commands import Session

        return Session.open(self.config_path)


def echo_notes(notes: Iterable[str]) -> None:
    for note in notes:
        click.echo(f"carry: {note}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option(
    "--config",
    "config_path",
    type=A_FILE,
    default="build.yaml",
    show_default=True,
    help="The build.yaml to use; VERSION and patches/ are found relative to it.",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path) -> None:
    """carry: fetch an upstream PR at a pinned commit, prove the patch series applies in order,
    and build a versioned wheel and container image from the patched tree.

    The cache (mirrors, bundles, build dirs, artifacts, logs) lives in $CARRY_CACHE
    (default ~/.cache/carry).
    """
    ctx.obj = Context(config_path)


@cli.group(invoke_without_command=True)
@click.pass_context
def version(ctx: click.Context) -> None:
    """Print VERSION (YYYYMMDD.N)."""
    if ctx.invoked_subcommand is None:
        from carry.commands import read_version

        click.echo(read_version(ctx.obj.config_path))


@version.command("bump")
@click.pass_obj
def version_bump(obj: Context) -> None:
    """Write today's UTC date with .1, or .N+1 when VERSION already holds today."""
    from carry.commands import bump_version

    click.echo(bump_version(obj.config_path))


@cli.command()
@click.option(
    "--update-pin", is_flag=True, help="Move upstream.commit in build.yaml to the PR head (and bump VERSION)."
)
@click.pass_obj
def fetch(obj: Context, update_pin: bool) -> None:
    """Fetch the pinned commit (and the PR head) into the cache mirror; print the base commit."""
    result = obj.session().fetch(update_pin=update_pin)
    echo_notes(result.notes)
    click.echo(result.base)


@cli.command()
@click.option("--against", "against", metavar="REF", help="Apply onto this upstream ref instead of the pin.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def check(obj: Context, against: str | None, as_json: bool) -> None:
    """Apply the series in order onto the pinned base (or REF) in a private index; exit 1 if any fails."""
    from carry.commands import check_table

    result = obj.session().check(against)
    echo_notes(result.notes)
    click.echo(json.dumps(result.report.to_json(), indent=2) if as_json else check_table(result.report))
    sys.exit(0 if result.report.ok else 1)


@overload
def parse_platform(text: str, flag: str = ...) -> Platform: ...
@overload
def parse_platform(text: None, flag: str = ...) -> None: ...
@overload
def parse_platform(text: str | None, flag: str = ...) -> Platform | None: ...
def parse_platform(text: str | None, flag: str = "--platform") -> Platform | None:
    from carry.platforms import Platform

    return Platform.parse(text, flag) if text is not None else None


@cli.command("wheel")
@click.option(
    "--arch",
    metavar="LIST",
    help="CUDA arches, e.g. 9.0,12.0,12.1, or none for a Python-only wheel "
    "(default: build.cuda_arches, or the platform's own from image.platforms).",
)
@click.option(
    "--out",
    type=A_DIR,
    default="dist",
    show_default=True,
    help="Directory the wheel is published into (atomically).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    help="Compile jobs (default: from build.env MAX_JOBS, else from cores and free memory).",
)
@click.option(
    "--platform",
    metavar="P",
    help="Build in the Dockerfile's build stage for this platform, e.g. "
    "linux/arm64 (emulated where the CPU is foreign), instead of on this machine.",
)
@click.option(
    "--hermetic", is_flag=True, help="With --platform: build with --network=none, requirements from a wheelhouse."
)
@click.option(
    "--wheelhouse",
    type=AN_EXISTING_DIR,
    help="With --platform --hermetic: the wheels (default: downloaded once into the cache).",
)
@click.option(
    "--from-source",
    is_flag=True,
    help="Compile, even where build.precompiled has a wheel to take the compiled code from.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the result as JSON (wheel, version, cache key, what the compiler cache did, the gate and tree check).",
)
@click.pass_obj
def wheel_command(
    obj: Context,
    arch: str | None,
    out: Path,
    jobs: int | None,
    platform: str | None,
    hermetic: bool,
    wheelhouse: Path | None,
    from_source: bool,
    as_json: bool,
) -> None:
    """Build the patched tree into a wheel for the CUDA arches (or, with build.precompiled, take the compiled code
    from the upstream's own wheel, proven to match the source), gate it, check it holds exactly the patched tree,
    stamp provenance; reuse when unchanged."""
    target = parse_platform(platform)
    session = obj.session()
    here = target is None or (not from_source and session.precompiled_for(target))
    if here and (hermetic or wheelhouse):
        raise click.UsageError("--hermetic and --wheelhouse go with --platform (a build in a container)")
    if not here and (jobs is not None or as_json):
        raise click.UsageError("--jobs and --json apply to builds on this machine; the build stage picks its jobs")
    if not from_source:
        session.require_pins((target,) if target else ())
    progress = Progress()
    if not here:
        assert target is not None  # not here: a --platform was given
        built = session.platform_wheel(target, arch, out, hermetic, wheelhouse, progress)
        progress.phase("done", f"{built.platform} wheel, gate passed for {built.gate.archlist}")
        click.echo(built.path)
        return
    result = session.wheel(arch, out, jobs, progress, target, from_source, one_artifact=True)
    progress.phase("done", "reused from cache" if result.reused else "built")
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else result.path)


@cli.command()
@click.argument("artifact")
@click.option("--arch", metavar="LIST", help="Gate against these arches instead of the ones the wheel recorded.")
@click.option(
    "--platform",
    metavar="P",
    help="For an image tag holding several platforms: verify only this one (default: every platform it holds).",
)
@click.option(
    "--key",
    "key_path",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="PUB",
    help="For an image: check its signature, SBOM and provenance with this public key (carry.pub, cosign.pub).",
)
@click.option(
    "--local",
    is_flag=True,
    help="Verify the image of that name in this Docker engine (built, not pushed) instead of the registry's.",
)
@click.pass_obj
def verify(
    obj: Context, artifact: str, arch: str | None, platform: str | None, key_path: Path | None, local: bool
) -> None:
    """Verify a wheel file, an image reference or a test report against this repo (VERSION, series hash, pinned
    commit). Wheels: RECORD hashes, the CUDA arch gate, the CPU of their shared objects, the test report beside
    them if any. Images: every platform the tag holds is pulled, its labels compared, its Python run (emulated
    where foreign) to import the wheel, and the installed shared objects gated. A test report (*.test.json) is
    checked against the artifact it names. With --key, an image's signature (cosign's simple signing), its SBOM
    (against the distributions the layers install) and its provenance (against this repo) are checked too; without
    build.yaml, only what needs no repository. Exit 1 on a mismatch, naming the field."""
    from carry.gputest.testrun import names_a_wheel

    key = None
    if key_path is not None:
        if artifact.endswith(".test.json") or names_a_wheel(artifact):
            raise click.UsageError("--key checks an image's signature; a wheel or test report has none")
        from carry.trust.keys import load_public

        key = load_public(key_path)
    if key is not None and not obj.config_path.exists():
        from carry.image.inspect import trustcheck

        only = trustcheck.verify_without_checkout(artifact, key, parse_platform(platform), "docker")
        click.echo("\n".join(line for result in only for line in result.lines()))
        sys.exit(0 if all(result.ok for result in only) else 1)
    if artifact.endswith(".test.json"):
        from carry.gputest import testrun

        result = testrun.check_report(Path(artifact))
        click.echo("\n".join(result.lines()))
        sys.exit(0 if result.ok else 1)
    results = obj.session().verify(artifact, parse_platform(platform), arch, key, local)
    click.echo("\n".join(line for result in results for line in result.lines()))
    if key is None and not names_a_wheel(artifact):  # said after the results: bad input stays one line
        click.echo("carry: note: the image's signature was not checked (pass --key PUB to check it)", err=True)
    sys.exit(0 if all(result.ok for result in results) else 1)


@cli.command("gate")
@click.argument("targets", nargs=-1, required=True, metavar="WHEEL|DIR|SO...")
@click.option(
    "--arch",
    metavar="LIST",
    help="Gate for these CUDA arches (default: build.cuda_arches of --config, "
    "or the platform's own from image.platforms).",
)
@click.option(
    "--platform",
    metavar="P",
    help="The CPU every .so must be code for, e.g. linux/arm64 (default: the "
    "wheel's platform tag; not checked for a tree or .so files without it).",
)
@click.option("--strict", is_flag=True, help="Ignore build.gate's rules: every shared object must run on every arch.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def gate_command(
    obj: Context, targets: tuple[str, ...], arch: str | None, platform: str | None, strict: bool, as_json: bool
) -> None:
    """Gate any wheel (upstream's own releases too: no buildinfo needed), unpacked tree or .so files: which GPUs
    can run each shared object, by build.yaml's gate policy when --config exists, else the strict rule (every
    arch by cubin), and the CPU of every .so. Prints the coverage table (in full on failure). Exit 0 when it
    passes, 1 when it does not."""
    from carry.commands import gate

    report = gate(obj.config_path, targets, arch, parse_platform(platform), strict)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo("\n".join(report.lines() if report.ok else report.full_lines()))
    sys.exit(0 if report.ok else 1)


@cli.command("image")
@click.option(
    "--push",
    is_flag=True,
    help="Push every tag (credentials: Docker config, or "
    "$CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD handed over on stdin).",
)
@click.option("--tag", "tags", metavar="T", multiple=True, help="An extra tag; repeatable.")
@click.option(
    "--platform",
    "platforms",
    metavar="P",
    multiple=True,
    help="Target platform, e.g. linux/arm64; repeatable, one build each (default: image.platforms); a "
    "foreign CPU needs QEMU's binfmt_misc handler.",
)
@click.option(
    "--arch", metavar="LIST", help="CUDA arches, or none (default: build.cuda_arches, or each platform's own)."
)
@click.option("--hermetic", is_flag=True, help="Build with --network=none, requirements from a wheelhouse.")
@click.option(
    "--wheelhouse",
    type=AN_EXISTING_DIR,
    help="Wheels for --hermetic (default: downloaded once into the cache).",
)
@click.option(
    "--cache-from",
    "cache_from",
    metavar="SPEC",
    multiple=True,
    help="Import BuildKit's layer cache: inline (this VERSION's pushed image), registry (its "
    "-buildcache ref), an image ref, or type=... (buildx); {arch} {version} filled per platform.",
)
@click.option(
    "--cache-to",
    "cache_to",
    metavar="SPEC",
    multiple=True,
    help="Export it: inline (inside the image; any BuildKit), registry (buildx, mode=max, to "
    "NAME:VERSION-ARCH-buildcache), or type=... (buildx).",
)
@click.option(
    "--no-smoke",
    "no_smoke",
    is_flag=True,
    help="With image.lock: skip the smoke test (after --push it pulls each platform's image back and keeps it).",
)
@click.option("--json", "as_json", is_flag=True, help="With image.lock: the layers and tags as JSON on stdout.")
@click.pass_obj
def image_command(
    obj: Context,
    push: bool,
    tags: tuple[str, ...],
    platforms: tuple[str, ...],
    arch: str | None,
    hermetic: bool,
    wheelhouse: Path | None,
    cache_from: tuple[str, ...],
    cache_to: tuple[str, ...],
    no_smoke: bool,
    as_json: bool,
) -> None:
    """Build the image with BuildKit, one build per platform (the build stage runs `build.py wheel`), tag it
    from VERSION, label it with its provenance, and optionally push; with several platforms each is tagged
    VERSION-ARCH and, on push, every shared tag becomes a manifest list of them all."""
    from carry.image.buildkit.image import ImageOptions
    from carry.image.buildkit.layercache import CacheSpec

    caches = tuple(CacheSpec.parse(s, False) for s in cache_from) + tuple(CacheSpec.parse(s, True) for s in cache_to)
    progress = Progress()
    options = ImageOptions(push, tags, tuple(parse_platform(p) for p in platforms), hermetic, wheelhouse, caches)
    session = obj.session()
    if session.config.image.lock:
        locked = session.locked_image(options, arch, not no_smoke, progress)
        echo_notes(locked.notes)
        click.echo(json.dumps(locked.to_json(), indent=2) if as_json else "\n".join(locked.lines()))
        return
    result = session.image(options, arch, progress)
    echo_notes(result.notes)
    click.echo("\n".join(result.lines()))


@cli.command("manifest")
@click.option(
    "--platform",
    "platforms",
    metavar="P",
    multiple=True,
    help="A platform to join; repeatable (default: image.platforms).",
)
@click.option("--tag", "tags", metavar="T", multiple=True, help="An extra shared tag; repeatable.")
@click.pass_obj
def manifest_command(obj: Context, platforms: tuple[str, ...], tags: tuple[str, ...]) -> None:
    """Make every shared tag (VERSION, the templates, --tag) a manifest list of the platforms' VERSION-ARCH
    images, which separate runs (one per platform) pushed; checked against the registry afterwards."""
    progress = Progress()
    joined = obj.session().manifest(tuple(parse_platform(p) for p in platforms), tags, progress)
    click.echo("\n".join(f"{ref}  {digest}" for ref, digest in joined.items()))


@cli.command("keygen")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
def keygen_command(directory: Path) -> None:
    """Write a new ECDSA P-256 signing key pair: DIRECTORY/carry.key (PKCS#8 PEM, mode 0600, encrypted with
    $CARRY_SIGNING_KEY_PASSWORD when it is set) and DIRECTORY/carry.pub (the public key verify --key and cosign
    verify --key take). Never overwrites a key (exit 2). `image --push` signs with $CARRY_SIGNING_KEY=DIR/carry.key."""
    import os

    from carry.trust import keys

    private, public = keys.keygen(directory, os.environ)
    encrypted = "encrypted" if os.environ.get(keys.PASSWORD_ENV) else "not encrypted: set $CARRY_SIGNING_KEY_PASSWORD"
    click.echo(f"{private}  private key, mode 0600, {encrypted}")
    click.echo(str(public))


@cli.command("test")
@click.argument("artifact")
@click.option(
    "--out",
    type=A_DIR,
    default="dist",
    show_default=True,
    help="Where an image's report goes (a wheel's goes beside the wheel).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=TEST_TIMEOUT_S,
    show_default=True,
    help="Seconds each command may run before it is killed.",
)
@click.pass_obj
def test_command(obj: Context, artifact: str, out: Path, timeout: float) -> None:
    """Run build.tests against a wheel (installed into a fresh venv) or an image (docker run --gpus all) on this
    machine's GPU; write the JSON report beside the wheel (<wheel>.test.json). Exit 1 if a test fails, 2 without
    a GPU."""
    from carry.gputest import testrun

    result = obj.session().test(artifact, out, timeout, Progress())
    click.echo("\n".join(testrun.summary(result.report, result.path)))
    sys.exit(0 if result.report.passed else 1)


@cli.command("prove")
@click.option("--arch", metavar="LIST", help="CUDA arches (default: build.cuda_arches).")
@click.option(
    "--out",
    type=A_DIR,
    default="dist",
    show_default=True,
    help="Wheels and reports go into OUT/prove/<prefix>/.",
)
@click.option("--jobs", type=click.IntRange(min=1), help="Compile jobs (as for `wheel`).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=TEST_TIMEOUT_S,
    show_default=True,
    help="Seconds each test command may run before it is killed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
@click.pass_obj
def prove_command(obj: Context, arch: str | None, out: Path, jobs: int | None, timeout: float, as_json: bool) -> None:
    """Build the wheel of every prefix of the series (base, base+0001 and on; cached like every build), run
    build.tests on each on this GPU, and print which patch flips which test from FAIL to PASS. Exit 1 unless the
    whole series passes, 2 without a GPU."""
    from carry.gputest import prove

    result = obj.session().prove(arch, out, jobs, timeout, Progress())
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else prove.table(result))
    sys.exit(0 if result.passed else 1)


@cli.command()
@click.option(
    "--against",
    "against",
    metavar="REF",
    multiple=True,
    help="Upstream ref to judge against; repeatable (default: upstream.main and the PR head).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option(
    "--fail-on",
    "fail_on",
    metavar="VERDICTS",
    help="Exit 1 when one of these verdicts occurs, e.g. MERGED-EXACT,MERGED-MODIFIED,CONFLICT.",
)
@click.option(
    "--test",
    "test",
    is_flag=True,
    help="Also run each patch's test (its Carry-Test trailer, or what "
    "prove learned) on each ref without the patch: FIXED-UPSTREAM when it passes.",
)
@click.pass_obj
def status(obj: Context, against: tuple[str, ...], as_json: bool, fail_on: str | None, test: bool) -> None:
    """One verdict per patch against newer upstream refs, each with its evidence: MERGED-EXACT, MERGED-MODIFIED,
    PARTIAL, CONFLICT, NEEDED; DELETED-UPSTREAM or PR-ONLY when the patched file is gone from REF (upstream deleted
    it, or only the PR has it); FIXED-UPSTREAM (--test) when the patch's test passes on REF without it. The PR's own
    state (open, closed, merged) comes first."""
    from carry.verdicts import verdicts

    failing = verdicts.Verdict.parse_list(fail_on, "--fail-on") if fail_on is not None else frozenset()
    result = obj.session().status(against, test, Progress() if test else None)
    echo_notes(result.notes)
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else verdicts.table(result))
    sys.exit(1 if failing & result.occurred else 0)


@cli.command("drop")
@click.argument("name")
@click.option("--against", "against", metavar="REF", help="Upstream ref that must have merged it (default: main).")
@click.option("--force", is_flag=True, help="Drop even when REF still needs the patch (logged as forced).")
@click.option(
    "--test", "test", is_flag=True, help="Run the patch's test on REF without it first: FIXED-UPSTREAM lets it go."
)
@click.option(
    "--onto",
    "onto",
    metavar="REF",
    help="Move the pin here (it must hold the merge) instead of to the commit that merged the patch.",
)
@click.pass_obj
def drop_command(obj: Context, name: str, against: str | None, force: bool, test: bool, onto: str | None) -> None:
    """Remove a patch REF needs no more (MERGED-*, DELETED-UPSTREAM, PR-ONLY, FIXED-UPSTREAM), move the pin to the
    commit that merged it (with upstream.pr: the PR head, which must hold it), carry the rest of the series over
    there, bump VERSION once and log it in patches/DROPPED.md; on a conflict nothing changes (exit 1)."""
    result = obj.session().drop(name, against, force, test, onto)
    echo_notes(result.notes)
    click.echo("\n".join(result.lines()))


@cli.command()
@click.option(
    "--onto",
    "onto",
    metavar="REF",
    help="Upstream ref to move onto: a tag, a branch, refs/... or a SHA (default: upstream.main).",
)
@click.option(
    "--test",
    "test",
    is_flag=True,
    help="On a conflict, run the patches' tests on REF too, so a patch upstream fixed its own way is named for `drop`.",
)
@click.pass_obj
def refresh(obj: Context, onto: str | None, test: bool) -> None:
    """Rebase the series onto a new upstream base (3-way merge, following upstream's renames), move the pin,
    rewrite the patches that moved and bump VERSION (when anything changed); on a conflict change nothing and exit 1,
    naming `drop` for the patches REF needs no more."""
    result = obj.session().refresh(onto, test)
    echo_notes(result.notes)
    click.echo("\n".join(result.lines()))


@cli.command("lock")
@click.option(
    "--platform",
    "platforms",
    metavar="P",
    multiple=True,
    help="Lock only this platform; repeatable (default: image.platforms).",
)
@click.option(
    "--check", "check_only", is_flag=True, help="Write nothing; exit 1 when a lock is missing or stale (for CI)."
)
@click.option("--upgrade", is_flag=True, help="Resolve afresh, not preferring the versions the lock pins now.")
@click.pass_obj
def lock_command(obj: Context, platforms: tuple[str, ...], check_only: bool, upgrade: bool) -> None:
    """Resolve the fixed wheel's Requires-Dist with uv into pinned, sha256-hashed wheels for each platform's runtime
    base image (its Python and glibc, read from the image), through your configured index; write it beside
    build.yaml (image.lock). A rerun with nothing changed rewrites no byte."""
    if check_only and upgrade:
        raise click.UsageError("--check writes nothing; leave out --upgrade")
    result = obj.session().lock(tuple(parse_platform(p) for p in platforms), check_only, upgrade, Progress())
    if check_only:
        for platform, stale in result.stale:
            click.echo(stale or f"{platform}: fresh")
        sys.exit(1 if any(stale for _, stale in result.stale) else 0)
    root = obj.config_path.absolute().parent
    click.echo("\n".join(outcome.line(root) for outcome in result.outcomes))


@cli.command("pin")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 when the written pins are not what discovery finds now (downloads to compare).",
)
@click.pass_obj
def pin_command(obj: Context, check_only: bool) -> None:
    """Find each platform's precompiled wheel on build.precompiled.nightly's per-commit index: the merge-base C of
    upstream.commit and main, else the nearest commit back along main whose compiled inputs are the patched tree's
    (max_walk); download and hash it (trust on first use: the index gives no hashes), prove its commit from its
    version, and write build.precompiled.wheels in place. Never another variant's or platform's wheel: exit 1 naming
    every commit refused, and why."""
    result = obj.session().pin(check_only, Progress())
    echo_notes(result.notes())
    if check_only:
        click.echo("\n".join(result.check_lines()))
        sys.exit(0 if result.fresh else 1)
    click.echo("\n".join(result.lines(obj.config_path.absolute())))


@cli.group("cache", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the sizes as JSON.")
@click.pass_context
def cache_command(ctx: click.Context, as_json: bool) -> None:
    """Show the size of each part of carry's cache ($CARRY_CACHE): mirrors, bundles, build dirs, environments,
    wheels, downloads, wheelhouses, logs, and the rest; hardlinked files counted once."""
    if ctx.invoked_subcommand is not None:
        return
    from carry import cachectl
    from carry.util.cache import Cache

    usage = cachectl.usage(Cache.from_env())
    click.echo(json.dumps(usage.to_json(), indent=2) if as_json else "\n".join(usage.lines()))


@cache_command.command("prune")
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=A_FILE,
    help="A config whose needs are kept; repeatable (default: the global --config, build.yaml).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.pass_obj
def cache_prune(obj: Context, configs: tuple[Path, ...], dry_run: bool) -> None:
    """Remove what no current config needs (old build environments, wheels, build dirs, mirrors, downloads,
    wheelhouses, logs); an entry another carry holds the lock of is skipped, and says so."""
    from carry import cachectl
    from carry.util.cache import Cache

    result = cachectl.prune(Cache.from_env(), configs or (obj.config_path,), dry_run)
    click.echo("\n".join(result.lines()))


def main() -> None:
    try:
        cli.main(prog_name="carry", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("carry: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"carry: error: {exc.format_message()}; see --help", err=True)
        sys.exit(2)
    except CarryError as exc:
        click.echo(f"carry: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    finally:
        # The process ends here. The interpreter's garbage collection at exit walks every object still alive (the
        # modules, the click commands, the config), which cost `check` ~10 ms, as much as all of carry's own work;
        # frozen objects it skips. atexit handlers still run and modules are still torn down; only cycles of garbage
        # made before this line are left to the OS, and carry closes what it opens with `with`.
        gc.freeze()

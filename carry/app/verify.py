"""`verify`: a wheel, an image, a test report or a suite report against this repository (or, with --key and no
build.yaml, an image against only what needs no repository); which of these the artifact is, decided here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from carry.app import App
from carry.arch import given
from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    from carry.platforms import Platform
    from carry.trust.keys import PublicKey
    from carry.wheelbuild import verify


@record(kw_only=True)
class VerifyRequest:
    config_path: Path
    artifact: str
    arch: str | None = None
    platform: Platform | None = None
    key_path: Path | None = None
    local: bool = False
    require: tuple[str, ...] = ()  # `--require NAME`: attestation kinds (carry.trust.kinds) the image must hold


@record
class VerifyOutcome:
    """Each result's lines (each has `lines()` and `ok`)."""

    results: tuple[Any, ...]

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self.results)


def verify_artifact(request: VerifyRequest) -> VerifyOutcome:
    """By what the artifact is: a suite report, a test report, a wheel file or an image reference."""
    from carry.gputest.testrun import names_a_wheel

    artifact = request.artifact
    if request.require:
        from carry.trust.kinds import required

        required(request.require)  # each a known name
        if request.key_path is None:
            raise BadInput("--require reads the image's signed attestations: give the public key with --key PUB")
    key = None
    if request.key_path is not None:
        if artifact.endswith((".test.json", ".suite.json")) or names_a_wheel(artifact):
            raise BadInput("--key checks an image's signature; a wheel or test report has none; see --help")
        from carry.trust.keys import load_public

        key = load_public(request.key_path)
    has_config = request.config_path.exists()
    if key is not None and not has_config:
        from carry.image.inspect import trustcheck

        found = trustcheck.verify_without_checkout(artifact, key, request.platform, "docker", request.require)
        return VerifyOutcome(tuple(found))
    if artifact.endswith(".suite.json"):
        from carry.gputest import upstreamsuite

        expected = upstreamsuite.Expected()
        if has_config:  # the selection, patched tree and pins this repository says now
            app = App.open(request.config_path)
            expected = upstreamsuite.expected_of(app.config, app.check().report.tree)
        return VerifyOutcome((upstreamsuite.check_report(Path(artifact), expected),))
    if artifact.endswith(".test.json"):
        from carry.gputest import testrun

        return VerifyOutcome((testrun.check_report(Path(artifact)),))
    results = verify_built(App.open(request.config_path), request, key)
    if key is None and not names_a_wheel(artifact):  # said once verified: bad input stays one line
        from carry.util import reporter

        reporter.note("note: the image's signature was not checked (pass --key PUB to check it)")
    return VerifyOutcome(results)


def verify_built(app: App, request: VerifyRequest, key: PublicKey | None) -> tuple[verify.Verification, ...]:
    """A wheel (and its test report), or an image's platforms; with `key`, its signature, SBOM and provenance too."""
    from carry.gputest import testrun
    from carry.wheelbuild import verify

    artifact, platform, arch = request.artifact, request.platform, request.arch
    if not testrun.names_a_wheel(artifact):
        from carry.image.inspect import imageverify

        patches = tuple((p.name, p.sha256) for p in app.series().patches) if key is not None else ()
        asked = imageverify.Request(
            ref=artifact,
            platform=platform,
            arches=given(arch),
            local=request.local,
            key=key,
            patches=patches,
            require=request.require,
        )
        return imageverify.verify_image(asked, app.config, app.expected(), app.cache.scratch)
    if request.local:
        raise BadInput("--local is for image references; a wheel is always the file given")
    if platform is not None:
        raise BadInput("--platform is for image tags; a wheel's platform is in its file name")
    path = Path(artifact)
    if not path.is_file():
        from carry.util import prog

        raise BadInput(
            f"{artifact}: no such wheel file; give the path `{prog.command('wheel')}` printed "
            f"(dist/NAME-VERSION-TAGS.whl)"
        )
    from carry.gputest import upstreamsuite

    checked = app.check()
    result = testrun.with_test_report(path, verify.verify_wheel(path, app.expected(checked), given(arch)))
    suite = upstreamsuite.expected_of(app.config, checked.report.tree)
    return (upstreamsuite.with_suite_report(path, result, suite),)

"""`fetch`: the pinned commit (and the PR head) into the cache mirror; with --update-pin, the pin moved to the PR
head (its precompiled pins first) and VERSION bumped, said in a note; else a PR head that is not the pin is a
warning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    from carry.app import App


@record(kw_only=True)
class FetchRequest:
    update_pin: bool = False


@record
class FetchResult:
    base: str


def fetch(app: App, request: FetchRequest) -> FetchResult:
    from carry.source import upstream
    from carry.util import reporter

    config = app.config
    needs = f"{config.path}: --update-pin needs upstream.pr and a reachable upstream"
    if request.update_pin and config.upstream.pr is None:
        raise BadInput(needs)  # before any work: one line
    report = upstream.fetch(config, app.cache)
    pr_head = report.pr_head
    if pr_head is None:
        if request.update_pin:
            raise BadInput(needs)  # after the note that says why upstream gave no PR head
        return FetchResult(report.base)
    warning = pr_head.describe(config.upstream.commit)
    if request.update_pin and pr_head.sha != config.upstream.commit:
        from carry import version

        app.repin(pr_head.sha)
        bumped = version.following(config.version_file)  # another pin: another artifact
        upstream.update_pin(config, pr_head.sha)
        version.write(config.version_file, bumped)
        reporter.note(f"pin moved {config.upstream.commit[:12]} -> {pr_head.sha} in {config.path}; VERSION {bumped}")
        return FetchResult(pr_head.sha)
    if warning:
        reporter.warn(warning)
    return FetchResult(report.base)

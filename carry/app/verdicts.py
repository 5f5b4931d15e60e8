"""`status`, `drop` and `refresh`: what upstream did with each carried patch, and acting on it; with --test, the
patches' tests judge too (carry/gputest/behaviour.py), on wheels built as this command builds them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from carry.util.record import record

if TYPE_CHECKING:
    from collections.abc import Callable

    from carry.app import App
    from carry.source.series import Series
    from carry.verdicts import drop, refresh, verdicts
    from carry.wheelbuild.wheel import Builder


@record(kw_only=True)
class StatusRequest:
    against: tuple[str, ...] = ()
    test: bool = False


@record(kw_only=True)
class DropRequest:
    name: str
    against: str | None = None
    force: bool = False
    test: bool = False
    onto: str | None = None


@record(kw_only=True)
class RefreshRequest:
    onto: str | None = None
    test: bool = False


def status(app: App, request: StatusRequest) -> verdicts.StatusReport:
    """A verdict per patch against each ref (default: main and the PR head); with `test`, each patch's test too."""
    from carry.verdicts import verdicts

    patches = app.series()
    report = verdicts.status(app.config, app.cache, patches, request.against, trees=request.test)
    if not request.test:
        return report
    from carry.gputest import behaviour

    return behaviour.judge(app.config, app.cache, _builder_for(app), report, patches)


def drop_patch(app: App, request: DropRequest) -> drop.Dropped:
    from carry.verdicts import drop

    asked = drop.Request(name=request.name, against=request.against, force=request.force, onto=request.onto)
    judge = _judge(app, request.test, notes=True)
    return drop.drop(app.config, app.cache, app.series(), asked, judge=judge, repin=app.repin)


def refresh_series(app: App, request: RefreshRequest) -> refresh.Refreshed:
    from carry.verdicts import refresh

    judge = _judge(app, request.test, notes=False)
    return refresh.refresh(app.config, app.cache, app.series(), request.onto, judge, app.repin)


def _judge(
    app: App, test: bool, notes: bool
) -> Callable[[verdicts.StatusReport, Series], verdicts.StatusReport] | None:
    """With `test`, what drop and refresh call to judge a status report by the patches' tests too. The tests' phases
    are held, never said (drop and refresh say one line); the judge's notes are said for `drop` (`notes`) only."""
    if not test:
        return None
    from carry.gputest import behaviour
    from carry.util import reporter

    def judge(report: verdicts.StatusReport, patches: Series) -> verdicts.StatusReport:
        with reporter.holding() if notes else reporter.silenced():
            return behaviour.judge(app.config, app.cache, _builder_for(app), report, patches)

    return judge


def _builder_for(app: App) -> Callable[[bool], Builder]:
    """The configured build of a tree, from source when asked: what `status --test` builds REF with."""
    return lambda from_source: app.builder(None, None, from_source=from_source)

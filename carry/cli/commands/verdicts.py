"""`status`, `drop`, `refresh` and `follow`: what upstream did with each patch, and acting on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from carry.cli.common import A_FILE, Context


@click.command()
@click.option(
    "--against",
    metavar="REF",
    multiple=True,
    help="Upstream ref to judge against; repeatable (default: upstream.main and the PR head).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option(
    "--fail-on",
    metavar="VERDICTS",
    help="Exit 1 when one of these verdicts occurs, e.g. MERGED-EXACT,MERGED-MODIFIED,CONFLICT.",
)
@click.option(
    "--test",
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
    from carry.app import verdicts as app

    result = app.status(obj.app(), app.StatusRequest(against=against, test=test))
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else verdicts.table(result))
    sys.exit(1 if failing & result.occurred else 0)


@click.command("drop")
@click.argument("name")
@click.option("--against", metavar="REF", help="Upstream ref that must have merged it (default: main).")
@click.option("--force", is_flag=True, help="Drop even when REF still needs the patch (logged as forced).")
@click.option("--test", is_flag=True, help="Run the patch's test on REF without it first: FIXED-UPSTREAM lets it go.")
@click.option(
    "--onto",
    metavar="REF",
    help="Move the pin here (it must hold the merge) instead of to the commit that merged the patch.",
)
@click.pass_obj
def drop_command(obj: Context, name: str, against: str | None, force: bool, test: bool, onto: str | None) -> None:
    """Remove a patch REF needs no more (MERGED-*, DELETED-UPSTREAM, PR-ONLY, FIXED-UPSTREAM), move the pin to the
    commit that merged it (with upstream.pr: the PR head, which must hold it), carry the rest of the series over
    there, bump VERSION once and log it in patches/DROPPED.md; on a conflict nothing changes (exit 1)."""
    from carry.app import verdicts as app

    asked = app.DropRequest(name=name, against=against, force=force, test=test, onto=onto)
    result = app.drop_patch(obj.app(), asked)
    click.echo("\n".join(result.lines()))


@click.command()
@click.option(
    "--onto",
    metavar="REF",
    help="Upstream ref to move onto: a tag, a branch, refs/... or a SHA (default: upstream.main).",
)
@click.option(
    "--test",
    is_flag=True,
    help="On a conflict, run the patches' tests on REF too, so a patch upstream fixed its own way is named for `drop`.",
)
@click.pass_obj
def refresh(obj: Context, onto: str | None, test: bool) -> None:
    """Rebase the series onto a new upstream base (3-way merge, following upstream's renames), move the pin,
    rewrite the patches that moved and bump VERSION (when anything changed); on a conflict change nothing and exit 1,
    naming `drop` for the patches REF needs no more."""
    from carry.app import verdicts as app

    result = app.refresh_series(obj.app(), app.RefreshRequest(onto=onto, test=test))
    click.echo("\n".join(result.lines()))


@click.command("follow")
@click.argument("ref", required=False)
@click.option(
    "--continue",
    "resume",
    is_flag=True,
    help="After resolving a conflict where the last run stopped: record the resolution and go on.",
)
@click.option("--push", metavar="REMOTE", help="Push the branch to this git remote (git's own credentials).")
@click.option("--body", type=A_FILE, help="Write the report as the pull request's body (markdown) to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--test", is_flag=True, help="Judge the patches by their tests too (status --test).")
@click.option("--no-build", is_flag=True, help="Stop after the lock: no wheel, suite or proof.")
@click.pass_obj
def follow_command(
    obj: Context,
    ref: str | None,
    resume: bool,
    push: str | None,
    body: Path | None,
    as_json: bool,
    test: bool,
    no_build: bool,
) -> None:
    """Take the project from its pin to upstream REF (default: upstream.follow) on the branch carry/follow/REF, one
    commit per step: drop what REF merged, carry the rest over (replaying recorded resolutions), move the pins, the
    lock and VERSION, build, compare the upstream's suite and prove; exit 1 when a human is needed (a conflict, a
    regression), with the branch as far as it got; nothing changes on the current branch."""
    from carry.app import follow
    from carry.util.errors import BadInput
    from carry.verdicts import followreport

    if resume and ref:
        raise BadInput("follow --continue takes no REF: it goes on with the run that stopped")
    asked = follow.Request(ref=ref, resume=resume, push=push, test=test, build=not no_build)
    report = follow.follow(obj.app(), asked)
    if body is not None and not report.get("nothing"):
        body.write_text(followreport.body(report))
    click.echo(json.dumps(report, indent=1) if as_json else "\n".join(followreport.lines(report)))
    sys.exit(report["exit"])

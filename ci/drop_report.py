#!/usr/bin/env python3
"""Turn `build.py status --json` output into a markdown report of the patches upstream needs no more (merged,
fixed its own way, or nothing left to patch), led by the carried PR's own state, and keep one GitHub issue up to
date with it.

    drop_report.py render STATUS.json [STATUS.json ...]    print the markdown
    drop_report.py publish STATUS.json [STATUS.json ...]   open, update or close the report issue (needs `gh`
                                                           and GH_TOKEN in the environment)

Several files may be given (e.g. one `status` run per ref); their refs are reported in order. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

# Where each field is found in the status JSON. The first name is the preferred one; later names are
# accepted too, so the report keeps working while the JSON shape settles. Unknown keys are ignored.
FIELDS = {
    "refs": ("refs",),
    "ref": ("ref",),
    "ref_commit": ("commit",),
    "patches": ("patches",),
    "name": ("name",),
    "verdict": ("verdict",),
    "evidence": ("evidence",),
    "upstream_commit": ("upstream_commit", "commit"),
    "trailer_note": ("trailer_note", "advice"),
    "difference": ("difference",),
    "droppable": ("droppable",),
    "pr": ("pr",),
    "pr_number": ("number",),
    "pr_state": ("state",),
    "merge_commit": ("merge_commit",),
    "source": ("source",),
    "where": ("where",),
    "detail": ("detail",),
}
# What each droppable verdict means, in the report's words; `status --json` also says `droppable` per patch.
DROPPABLE = {
    "MERGED-EXACT": "merged upstream as it is",
    "MERGED-MODIFIED": "merged upstream with edits",
    "FIXED-UPSTREAM": "fixed upstream its own way (its test passes without it)",
    "DELETED-UPSTREAM": "its file was deleted upstream: nothing left to patch",
    "PR-ONLY": "only the PR has its file, and the PR is not in the ref: nothing left to patch",
}

TITLE = "carry: patches ready to drop"
LABEL = "carry-drop-report"
LABEL_COLOR = "0e8a16"
MARKER = "<!-- carry:drop-report -->"
BODY_LIMIT = 60_000  # GitHub refuses issue bodies over 65,536 characters
EVIDENCE_ITEM_LIMIT = 4_000
SHORT_SHA = 12


class ReportError(Exception):
    """Input the report cannot be made from (exit 2)."""


class GhError(Exception):
    """A `gh` call that failed (exit 1)."""


@dataclasses.dataclass(frozen=True)
class PatchVerdict:
    name: str
    verdict: str
    evidence: tuple[str, ...]
    upstream_commit: str | None
    trailer_note: str | None
    difference: str | None
    marked_droppable: bool | None = None  # what status said, when it said it

    @property
    def droppable(self) -> bool:
        return self.marked_droppable if self.marked_droppable is not None else self.verdict in DROPPABLE


@dataclasses.dataclass(frozen=True)
class PrState:
    """The carried PR's state as `status` found it, and where from (the GitHub API or git)."""

    number: int
    state: str
    merge_commit: str | None
    source: str
    where: str
    detail: str | None

    @property
    def closed_unmerged(self) -> bool:
        return self.state == "closed"

    def sentence(self, upstream_url: str | None) -> str:
        source = "the GitHub API" if self.source == "github" else "git"
        origin = f" (from {source}: {code(self.where)})" if self.where else f" (from {source})"
        detail = f"; {code(one_line(self.detail))}" if self.detail else ""
        if self.closed_unmerged:
            return (f"**PR #{self.number} was closed without being merged**{origin}{detail}. Its patches have no "
                    f"upstream PR to wait for any more: move the carry to a release (`build.py refresh --onto "
                    f"<tag>`) and drop what it needs no more.")
        if self.state == "merged":
            at = f" as {commit_link(self.merge_commit, upstream_url)}" if self.merge_commit else ""
            return f"PR #{self.number} is merged{at}{origin}{detail}."
        return f"PR #{self.number}: {self.state}{origin}{detail}."


@dataclasses.dataclass(frozen=True)
class RefReport:
    ref: str
    commit: str
    patches: tuple[PatchVerdict, ...]

    @property
    def droppable(self) -> tuple[PatchVerdict, ...]:
        return tuple(p for p in self.patches if p.droppable)


# --- reading the status JSON ----------------------------------------------------------------------------


def _pick(mapping: object, field: str, where: str, required: bool = True):
    if not isinstance(mapping, dict):
        raise ReportError(f"{where}: expected a JSON object, got {type(mapping).__name__}")
    for key in FIELDS[field]:
        if key in mapping and mapping[key] is not None:
            return mapping[key]
    if required:
        raise ReportError(f"{where}: missing {' or '.join(repr(k) for k in FIELDS[field])}")
    return None


def _text(value: object, where: str) -> str:
    if not isinstance(value, (str, int)):
        raise ReportError(f"{where}: expected a string, got {type(value).__name__}")
    return str(value)


def _evidence(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(_text(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise ReportError(f"{where}: expected a string or a list of strings, got {type(value).__name__}")


def _optional_text(value: object, where: str) -> str | None:
    return None if value in (None, "") else _text(value, where)


def parse_patch(data: object, where: str) -> PatchVerdict:
    verdict = _text(_pick(data, "verdict", where), f"{where}.verdict").strip().upper().replace("_", "-")
    return PatchVerdict(
        name=_text(_pick(data, "name", where), f"{where}.name"),
        verdict=verdict,
        evidence=_evidence(_pick(data, "evidence", where, required=False), f"{where}.evidence"),
        upstream_commit=_optional_text(_pick(data, "upstream_commit", where, False), f"{where}.upstream_commit"),
        trailer_note=_optional_text(_pick(data, "trailer_note", where, False), f"{where}.trailer_note"),
        difference=_optional_text(_pick(data, "difference", where, False), f"{where}.difference"),
        marked_droppable=_flag(_pick(data, "droppable", where, False), f"{where}.droppable"),
    )


def _flag(value: object, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ReportError(f"{where}: expected true or false, got {type(value).__name__}")


def parse_pr(data: object, where: str) -> PrState | None:
    """The `pr` object of the status JSON, or None when there is none (no upstream.pr)."""
    pr = _pick(data, "pr", where, required=False)
    if pr is None:
        return None
    at = f"{where}.pr"
    number = _pick(pr, "pr_number", at)
    if isinstance(number, bool) or not isinstance(number, int):
        raise ReportError(f"{at}.number: expected a number, got {type(number).__name__}")
    return PrState(
        number=number,
        state=_text(_pick(pr, "pr_state", at), f"{at}.state"),
        merge_commit=_optional_text(_pick(pr, "merge_commit", at, False), f"{at}.merge_commit"),
        source=_text(_pick(pr, "source", at, False) or "git", f"{at}.source"),
        where=_optional_text(_pick(pr, "where", at, False), f"{at}.where") or "",
        detail=_optional_text(_pick(pr, "detail", at, False), f"{at}.detail"),
    )


def parse_status(data: object, where: str) -> tuple[RefReport, ...]:
    refs = _pick(data, "refs", where)
    if not isinstance(refs, list):
        raise ReportError(f"{where}.refs: expected a list")
    reports = []
    for i, ref in enumerate(refs):
        at = f"{where}.refs[{i}]"
        patches = _pick(ref, "patches", at)
        if not isinstance(patches, list):
            raise ReportError(f"{at}.patches: expected a list")
        reports.append(RefReport(
            ref=_text(_pick(ref, "ref", at), f"{at}.ref"),
            commit=_text(_pick(ref, "ref_commit", at), f"{at}.commit"),
            patches=tuple(parse_patch(p, f"{at}.patches[{j}]") for j, p in enumerate(patches)),
        ))
    return tuple(reports)


def load_all(paths: list[Path]) -> tuple[tuple[RefReport, ...], PrState | None]:
    """Every ref of every file, in order, and the PR's state (the last file that has one)."""
    reports: list[RefReport] = []
    pr = None
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ReportError(f"{path}: cannot read it ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); "
                              "pass the output of `build.py status --json`") from None
        reports.extend(parse_status(data, path.name))
        pr = parse_pr(data, path.name) or pr
    return tuple(reports), pr


# --- markdown ---------------------------------------------------------------------------------------------


def code(text: str) -> str:
    """`text` as inline code, with a backtick fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def block(text: str, language: str = "", indent: str = "") -> list[str]:
    """`text` as a fenced code block whose fence no line inside can close."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return [f"{indent}{fence}{language}", *(f"{indent}{line}" for line in text.splitlines()), f"{indent}{fence}"]


def one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def commit_link(sha: str, upstream_url: str | None) -> str:
    shown = code(sha[:SHORT_SHA])
    match = re.match(r"^https://github\.com/([^/\s]+/[^/\s]+?)(?:\.git)?/?$", upstream_url or "")
    return f"[{shown}](https://github.com/{match.group(1)}/commit/{sha})" if match else shown


def drop_command(patch: PatchVerdict, report: RefReport) -> str:
    """The command that drops `patch`, judged against the ref it was found merged in."""
    return shlex.join(["python", "build.py", "drop", patch.name, "--against", report.ref])


def _patch_section(patch: PatchVerdict, report: RefReport, upstream_url: str | None) -> list[str]:
    lines = [f"### {code(patch.name)}: {patch.verdict}", ""]
    if patch.upstream_commit:
        lines.append(f"- Upstream commit: {commit_link(patch.upstream_commit, upstream_url)}")
    if patch.trailer_note:
        lines.append(f"- Note: {code(one_line(patch.trailer_note))}")
    lines.append(f"- Drop it: {code(drop_command(patch, report))}")
    if patch.evidence:
        # One code block: upstream text (commit subjects, hunks) can't mention people or link issues from here.
        lines += ["- Evidence:", ""]
        lines += block("\n".join(_clip(item, EVIDENCE_ITEM_LIMIT) for item in patch.evidence), indent="  ")
    if patch.difference:
        summary = f"Remaining difference between the patch and {html.escape(report.ref)}"
        lines += ["", f"<details><summary>{summary}</summary>", ""]
        lines += block(_clip(patch.difference, EVIDENCE_ITEM_LIMIT), "diff")
        lines += ["", "</details>"]
    return [*lines, ""]


def _summary_table(reports: tuple[RefReport, ...], upstream_url: str | None) -> list[str]:
    lines = ["## Every verdict", "", "| ref | patch | verdict | upstream commit |", "| --- | --- | --- | --- |"]
    for report in reports:
        for patch in report.patches:
            commit = commit_link(patch.upstream_commit, upstream_url) if patch.upstream_commit else ""
            row = (code(report.ref), code(patch.name), code(patch.verdict), commit)
            lines.append("| " + " | ".join(part.replace("|", "\\|") for part in row) + " |")
    return [*lines, ""]


def render(reports: tuple[RefReport, ...], upstream_url: str | None = None, run_url: str | None = None,
           pr: PrState | None = None) -> str:
    """The report: the PR's state first (a PR closed without being merged is the news), the droppable patches per
    ref with their evidence, then every verdict in one table."""
    droppable = sorted({p.name for r in reports for p in r.droppable})
    head = [MARKER, ""]
    if pr is not None:
        head += [pr.sentence(upstream_url), ""]
    if droppable:
        found = [v for v in DROPPABLE if any(p.verdict == v for r in reports for p in r.droppable)]
        why = "; ".join(f"{code(v)}: {DROPPABLE[v]}" for v in found) or "status marks them droppable"
        head.append(f"{len(droppable)} carried patch(es) can be dropped, the ref named below needs them no more "
                    f"({why}).")
    else:
        head.append("No carried patch is merged upstream, fixed there or left without a file to patch: nothing to "
                    "drop.")
    head.append("")
    sections = []
    for report in reports:
        if report.droppable:
            section = [f"## Against {code(report.ref)} ({commit_link(report.commit, upstream_url)})", ""]
            for patch in report.droppable:
                section += _patch_section(patch, report, upstream_url)
            sections.append(section)
    sections.append(_summary_table(reports, upstream_url))
    where = f" in [this run]({run_url})" if run_url else ""
    foot = [f"_Made by `ci/drop_report.py` from `build.py status --json`{where}._"]
    return _fit(head, sections, foot)


def _fit(head: list[str], sections: list[list[str]], foot: list[str]) -> str:
    """Join whole sections while the body stays under GitHub's limit; say how many were left out."""
    lines = list(head)
    used = len("\n".join(head + foot)) + 200
    for index, section in enumerate(sections):
        size = len("\n".join(section)) + 1
        if used + size > BODY_LIMIT:
            lines += [f"_{len(sections) - index} section(s) left out: the report is too long for an issue; "
                      "see the workflow log._", ""]
            break
        lines += section
        used += size
    return "\n".join(lines + foot) + "\n"


# --- the issue ----------------------------------------------------------------------------------------------


def gh(*args: str) -> str:
    try:
        result = subprocess.run(["gh", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise GhError("`gh` is not on PATH; install the GitHub CLI") from None
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise GhError(f"gh {' '.join(args[:2])} failed: {reason}")
    return result.stdout


def report_issue(issues: list[dict]) -> int | None:
    """The number of the open report issue: the oldest one whose body carries the marker."""
    numbers = [issue["number"] for issue in issues if MARKER in (issue.get("body") or "")]
    return min(numbers) if numbers else None


def publish(body: str, has_droppable: bool) -> str:
    """Create, update or close the report issue; say what was done. `has_droppable`: there is news (a patch to
    drop, or a PR closed without being merged)."""
    if not os.environ.get("GH_TOKEN"):
        raise ReportError("GH_TOKEN is not set; export a token that may write issues")
    listed = gh("issue", "list", "--state", "open", "--label", LABEL, "--limit", "100", "--json", "number,body")
    number = report_issue(json.loads(listed or "[]"))
    if number is None and not has_droppable:
        return "nothing to drop and no open report issue: nothing done"
    with tempfile.TemporaryDirectory(prefix="drop-report-") as scratch:
        body_file = Path(scratch, "body.md")
        body_file.write_text(body)
        if number is None:
            gh("label", "create", LABEL, "--color", LABEL_COLOR, "--force",
               "--description", "Carried patches that upstream has merged")
            url = gh("issue", "create", "--title", TITLE, "--label", LABEL, "--body-file", str(body_file)).strip()
            return f"opened {url}"
        gh("issue", "edit", str(number), "--title", TITLE, "--body-file", str(body_file))
        if not has_droppable:
            gh("issue", "close", str(number), "--comment", "Nothing to drop any more.")
            return f"updated and closed issue #{number}"
        return f"updated issue #{number}"


# --- command line -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drop_report.py", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("render", "publish"))
    parser.add_argument("status", nargs="+", type=Path, help="files holding `build.py status --json` output")
    parser.add_argument("--upstream-url", help="upstream.url, to link upstream commits on GitHub")
    parser.add_argument("--run-url", help="the CI run that made the report")
    args = parser.parse_args(argv)
    try:
        reports, pr = load_all(args.status)
        body = render(reports, args.upstream_url, args.run_url, pr)
        if args.action == "render":
            sys.stdout.write(body)
        else:
            news = any(r.droppable for r in reports) or (pr is not None and pr.closed_unmerged)
            print(f"drop_report: {publish(body, news)}")
    except ReportError as exc:
        print(f"drop_report: error: {exc}", file=sys.stderr)
        return 2
    except GhError as exc:
        print(f"drop_report: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

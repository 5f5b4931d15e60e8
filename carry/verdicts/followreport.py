"""What `follow` did, as the pull request's body (markdown, within GitHub's 65,536 characters) and as lines."""

from __future__ import annotations

from typing import Any

from carry.util import prog

LIMIT = 65_536
EVIDENCE_SHOWN = 12  # evidence lines per patch before "… N more"


def body(report: dict[str, Any]) -> str:
    """The body: REF and what it is, each patch's verdict, evidence and fate, what moved, the proofs, the commands.
    Evidence is cut (saying so) until the whole fits LIMIT."""
    for shown in (EVIDENCE_SHOWN, 4, 1, 0):
        text = _render(report, shown)
        if len(text) <= LIMIT:
            return text
    return text[: LIMIT - 40] + "\n\n… (cut to GitHub's body limit)\n"


def _render(report: dict[str, Any], shown: int) -> str:
    ref, commit, pin = report["ref"], report["commit"], report["pin"]
    state = "ready" if report["exit"] == 0 else "needs a human"
    since = report["upstream"]
    tags = f"; releases: {', '.join(since['tags'])}" if since["tags"] else ""
    out = [
        f"## carry follow {ref}: {state}",
        "",
        f"Upstream `{ref}` is `{commit}`: {since['commits']} commit(s) since the pin `{pin[:12]}`{tags}.",
        f"Branch `{report['branch']}` from `{report['base'][:12]}`; VERSION `{report['version']}`.",
        "",
    ]
    if report["needs"]:
        out += ["### What needs a human", "", *[f"- {line}" for line in report["needs"]], ""]
    out += ["### Patches", "", "| patch | verdict | what happened |", "| --- | --- | --- |"]
    for patch in report["patches"]:
        detail = f": {patch['detail']}" if patch["detail"] else ""
        out.append(f"| `{patch['name']}` | {patch['verdict']} ({patch['decided_by']}) | {patch['fate']}{detail} |")
    out.append("")
    for patch in report["patches"]:
        evidence = patch["evidence"]
        if not evidence or shown == 0:
            continue
        out += [f"<details><summary>{patch['name']}: {patch['verdict']} evidence</summary>", "", "```"]
        out += evidence[:shown]
        if len(evidence) > shown:
            out.append(f"… {len(evidence) - shown} more line(s): `{prog.command('status', '--against', ref)}`")
        out += ["```", "</details>", ""]
    out += ["### What moved", ""]
    out += [
        f"- replayed: {r['patch']}, the recorded resolution `{r['entry'][:12]}` of `{r['file']}`"
        for r in report["replayed"]
    ]
    out += [f"- recorded: `{path}`" for path in report["recorded"]]
    out += [f"- pin: `{pin[:12]}` -> `{commit[:12]}`" if report.get("tree") else "- pin: not moved (stopped before)"]
    out += [f"- precompiled: {line}" for line in report["pins"]] or ["- precompiled pins: none configured"]
    out.append(f"- runtime lock: {report['lock'] or 'none configured'}")
    out += ["", "### Proofs", ""]
    out += [f"- wheel ({w['platform'] or 'this machine'}): `{w['wheel'].rsplit('/', 1)[-1]}`" for w in report["wheels"]]
    for suite in report["suite"]:
        out.append(f"- suite ({suite['platform']}): {suite['verdict']}: {suite['line']} (against `{suite['against']}`)")
        out += [f"  - regressed: `{test}`" for test in suite["regressed"][:50]]
        out += [f"  - fixed: `{test}`" for test in suite["fixed"][:50]]
    out += [f"- {line}" for line in report["proofs"]]
    if not (report["wheels"] or report["suite"] or report["proofs"]):
        out.append("- none: the run stopped before the build")
    out += ["", "### Reproduce", "", "```", *commands(report), "```", ""]
    out += ["| step | seconds |", "| --- | ---: |", *[f"| {s['step']} | {s['seconds']} |" for s in report["steps"]]]
    return "\n".join(out) + "\n"


def commands(report: dict[str, Any]) -> list[str]:
    """The commands a maintainer runs by hand for the same result, on the branch."""
    ref = report["ref"]
    found = [prog.command("status", "--against", ref)]
    found += [prog.command("drop", p["name"], "--against", ref) for p in report["patches"] if p["fate"] == "dropped"]
    found.append(prog.command("refresh", "--onto", ref))
    if report["pins"] and not report["pins"][0].startswith("not moved"):
        found.append(prog.command("pin"))
    if report["lock"]:
        found.append(prog.command("lock"))
    for wheel in report["wheels"]:
        found.append(prog.command("wheel", *(["--platform", wheel["platform"]] if wheel["platform"] else [])))
    found += [prog.command("suite", w["wheel"]) for w in report["wheels"] if report["suite"]]
    return found + [f"# or all of it: {prog.command('follow', ref)}"]


def lines(report: dict[str, Any]) -> list[str]:
    """What `follow` prints at its end."""
    if report.get("nothing"):
        return []
    out = [
        f"{p['name']}: {p['verdict']} -> {p['fate']}" + (f" ({p['detail']})" if p["detail"] else "")
        for p in report["patches"]
    ]
    out += [f"needs a human: {line}" for line in report["needs"]]
    state = "ready" if report["exit"] == 0 else "stopped"
    return [*out, f"branch {report['branch']} {state} (VERSION {report['version']})"]

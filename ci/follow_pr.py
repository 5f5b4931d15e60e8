"""Open or update the ONE pull request of a `carry follow` branch, through GitHub's REST API (GraphQL for the draft
state, which REST cannot change), with the body `follow --body` wrote.

    python ci/follow_pr.py REPORT.json BODY.md --base main

REPORT.json is `follow --json`'s output. The pull request is found by its head branch (`carry/follow/<REF>`): a
second run on the same REF edits it, never opens another. It is a draft while a human is needed (follow's exit 1)
and ready for review once a run is ready (exit 0); it carries the label `carry-follow`. The token comes from
GITHUB_TOKEN or GH_TOKEN (a request header, never argv or the output); the repository from GITHUB_REPOSITORY
(owner/name); the API from GITHUB_API_URL (set on every GitHub Actions runner; GitHub Enterprise's, a test
server's). Exit 2: bad input (a missing token, repository or file); 1: the API refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

LABEL = "carry-follow"
TIMEOUT_S = 60


class Refused(Exception):
    pass


class Api:
    def __init__(self, root: str, repo: str, token: str):
        self.root, self.repo, self.token = root.rstrip("/"), repo, token

    def call(self, method: str, path: str, body: dict | None = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.root}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/vnd.github+json")
        request.add_header("X-GitHub-Api-Version", "2022-11-28")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            raise Refused(f"{method} {path}: HTTP {exc.code} {exc.reason}") from None
        except OSError as exc:
            raise Refused(f"{method} {path}: {exc}") from None
        return json.loads(text) if text else None

    def graphql(self, query: str, node: str) -> None:
        found = self.call("POST", "/graphql", {"query": query, "variables": {"id": node}})
        if isinstance(found, dict) and found.get("errors"):
            raise Refused(f"graphql: {found['errors'][0].get('message', found['errors'])}")


READY = "mutation($id: ID!) { markPullRequestReadyForReview(input: {pullRequestId: $id}) { clientMutationId } }"
DRAFT = "mutation($id: ID!) { convertPullRequestToDraft(input: {pullRequestId: $id}) { clientMutationId } }"


def publish(api: Api, report: dict, body: str, base: str) -> str:
    """Create or edit the pull request of the report's branch; what was done, in one line."""
    owner = api.repo.split("/")[0]
    branch = report["branch"]
    draft = report["exit"] != 0
    state = "ready" if not draft else "needs a human"
    title = f"carry follow {report['ref']} ({report['commit'][:12]}): {state}"
    head = urllib.parse.quote(f"{owner}:{branch}", safe="")
    found = api.call("GET", f"/repos/{api.repo}/pulls?state=open&head={head}")
    open_prs = [pr for pr in found if isinstance(pr, dict)] if isinstance(found, list) else []
    if open_prs:
        pr = min(open_prs, key=lambda p: p["number"])
        api.call("PATCH", f"/repos/{api.repo}/pulls/{pr['number']}", {"title": title, "body": body})
        if pr.get("draft") != draft:
            api.graphql(DRAFT if draft else READY, pr["node_id"])
        done = f"updated #{pr['number']}"
    else:
        pr = api.call(
            "POST",
            f"/repos/{api.repo}/pulls",
            {"title": title, "body": body, "head": branch, "base": base, "draft": draft},
        )
        assert isinstance(pr, dict)
        done = f"opened #{pr['number']}"
    api.call("POST", f"/repos/{api.repo}/issues/{pr['number']}/labels", {"labels": [LABEL]})
    return f"{done} ({'draft' if draft else 'ready for review'}): {pr.get('html_url', '')}".rstrip(": ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="follow_pr.py", description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="`carry follow --json` output")
    parser.add_argument("body", type=Path, help="`carry follow --body` output")
    parser.add_argument("--base", default="main", help="the branch the pull request goes into")
    args = parser.parse_args(argv)
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    repo = os.environ.get("GITHUB_REPOSITORY", "")
    api_root = os.environ.get("GITHUB_API_URL", "")
    problem = (
        "GITHUB_TOKEN (or GH_TOKEN) is not set; export a token that may write pull requests"
        if not token
        else "GITHUB_REPOSITORY is not owner/name; set it"
        if repo.count("/") != 1
        else "GITHUB_API_URL is not set; set it to the API's root"
        if not api_root
        else None
    )
    try:
        report, body = json.loads(args.report.read_text()), args.body.read_text()
    except (OSError, ValueError) as exc:
        problem = problem or f"cannot read the report or the body ({exc}); run `carry follow --json --body` first"
    if problem is None and report.get("nothing"):
        print("follow_pr: the pin is upstream's ref already: no pull request")
        return 0
    if problem is not None:
        print(f"follow_pr: error: {problem}", file=sys.stderr)
        return 2
    try:
        print(f"follow_pr: {publish(Api(api_root, repo, token or ''), report, body, args.base)}")
    except Refused as exc:
        print(f"follow_pr: error: the API refused: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

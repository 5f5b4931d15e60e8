"""Local HTTP servers answering GitHub's `GET /repos/{owner}/{repo}/pulls/{n}` with the JSON GitHub documents
(state, merged, merged_at, merge_commit_sha, closed_at): GitHub itself cannot be reached from the test machines, so
carry's API path is tested against this, through `$CARRY_GITHUB_API`."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator


class Api:
    def __init__(self, server: http.server.HTTPServer, pulls: dict[str, dict]):
        self.server = server
        self.pulls = pulls  # "owner/repo/n" -> the PR's JSON
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, headers) of every request

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


def pull(state: str, merged: bool = False, merge_commit: str | None = None, when: str = "2026-11-20T10:00:00Z") -> dict:
    """A pull request object as GitHub's REST API returns it (the fields carry reads, and a few it does not)."""
    return {
        "number": 0,
        "title": "a PR",
        "state": state,
        "merged": merged,
        "draft": False,
        "merged_at": when if merged else None,
        "closed_at": when if state == "closed" else None,
        "merge_commit_sha": merge_commit or "f" * 40,
        "html_url": "https://github.example/pull/0",
    }


@contextlib.contextmanager
def serving(pulls: dict[str, dict]) -> Iterator[Api]:
    api: Api

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            api.requests.append((self.path, dict(self.headers.items())))
            key = self.path.removeprefix("/repos/").replace("/pulls/", "/")
            body = api.pulls.get(key)
            data = json.dumps(body if body is not None else {"message": "Not Found"}).encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api = Api(server, pulls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def pull_requests(repo: str) -> Iterator[Api]:
    """A server keeping pull requests as GitHub's REST API does for `repo` (list by head, create, edit, labels) and
    the two GraphQL mutations of the draft state; `api.pulls` holds them by number, `api.requests` every request
    (method and path, headers)."""
    api: Api

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

        def do_GET(self):  # noqa: N802
            api.requests.append((f"GET {self.path}", dict(self.headers.items())))
            path, _, query = self.path.partition("?")
            asked = dict(part.split("=", 1) for part in query.split("&") if "=" in part)
            head = urllib.parse.unquote(asked.get("head", ""))
            if path != f"/repos/{repo}/pulls":
                return self._answer(404, {"message": "Not Found"})
            found = [
                pr for pr in api.pulls.values() if pr["state"] == "open" and (not head or pr["head"]["label"] == head)
            ]
            return self._answer(200, found)

        def do_POST(self):  # noqa: N802
            api.requests.append((f"POST {self.path}", dict(self.headers.items())))
            body = self._body()
            if self.path == f"/repos/{repo}/pulls":
                number = len(api.pulls) + 1
                owner = repo.split("/")[0]
                api.pulls[str(number)] = {
                    **pull("open"),
                    "number": number,
                    "node_id": f"PR_{number}",
                    "title": body["title"],
                    "body": body["body"],
                    "draft": bool(body.get("draft")),
                    "base": {"ref": body["base"]},
                    "head": {"ref": body["head"], "label": f"{owner}:{body['head']}"},
                    "labels": [],
                    "html_url": f"https://github.example/{repo}/pull/{number}",
                }
                return self._answer(201, api.pulls[str(number)])
            if self.path.startswith(f"/repos/{repo}/issues/") and self.path.endswith("/labels"):
                pr = api.pulls[self.path.split("/")[-2]]
                pr["labels"] = sorted({*pr["labels"], *body["labels"]})
                return self._answer(200, [{"name": name} for name in pr["labels"]])
            if self.path == "/graphql":
                pr = next(p for p in api.pulls.values() if p["node_id"] == body["variables"]["id"])
                pr["draft"] = "convertPullRequestToDraft" in body["query"]
                return self._answer(200, {"data": {}})
            return self._answer(404, {"message": "Not Found"})

        def do_PATCH(self):  # noqa: N802
            api.requests.append((f"PATCH {self.path}", dict(self.headers.items())))
            pr = api.pulls.get(self.path.removeprefix(f"/repos/{repo}/pulls/"))
            if pr is None:
                return self._answer(404, {"message": "Not Found"})
            pr.update({k: v for k, v in self._body().items() if k in ("title", "body")})
            return self._answer(200, pr)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api = Api(server, {})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()

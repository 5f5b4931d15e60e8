"""A local HTTP server answering GitHub's `GET /repos/{owner}/{repo}/pulls/{n}` with the JSON GitHub documents
(state, merged, merged_at, merge_commit_sha, closed_at): GitHub itself cannot be reached from the test machines, so
carry's API path is tested against this, through `$CARRY_GITHUB_API`."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
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

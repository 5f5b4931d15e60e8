"""A package index of our own on loopback (PEP 503 simple pages) that breaks its file downloads on purpose.

`Index(files)` serves `/simple/<project>/` with a link per file (its sha256 in the fragment, as indexes give it) and
`/files/<name>` with HTTP range requests (206), on 127.0.0.1 at a free port; point pip at it with
`PIP_INDEX_URL=<index.url>/simple/` (loopback, no registry host). `faults[name]` breaks one file's downloads:

- `cut-once`: the first response sends the full Content-Length, half the bytes, and closes the connection; the
  following ones are whole (a dropped connection);
- `cut`: every response closes the connection after CUT bytes (a link that keeps dropping);
- `no-range`: a range request is answered 200 with the whole file, as a server that ignores ranges does;
- `short`: the file cut to half, served as if that were all of it (a truncated upload): consistent headers.

`requests` lists every file request as (name, the Range asked, status sent).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
import urllib.parse

CUT = 1000


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Index

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path.startswith("/simple/"):
            self._page(path.removeprefix("/simple/").strip("/"))
        elif path.startswith("/files/") and path.removeprefix("/files/") in self.server.files:
            self._file(path.removeprefix("/files/"))
        else:
            self.send_error(404)

    def _page(self, project: str) -> None:
        links = [
            f'<a href="../../files/{urllib.parse.quote(name)}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>'
            for name, data in sorted(self.server.files.items())
            if name.lower().startswith(f"{project}-")
        ]
        if not links:
            self.send_error(404)
            return
        body = f"<!DOCTYPE html>\n<html><body>\n{chr(10).join(links)}\n</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _file(self, name: str) -> None:
        data = self.server.files[name]
        fault = self.server.faults.get(name)
        asked = self.headers.get("Range")
        with self.server.lock:
            first = not any(seen == name for seen, _, _ in self.server.requests)
        if fault == "short":
            data = data[: len(data) // 2]
        start = int(asked.removeprefix("bytes=").split("-")[0]) if asked and fault != "no-range" else 0
        status = 206 if start else 200
        with self.server.lock:
            self.server.requests.append((name, asked, status))
        body = data[start:]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if fault == "cut" or (fault == "cut-once" and first):
            self.wfile.write(body[: CUT if fault == "cut" else len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


class Index(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.faults: dict[str, str] = {}
        self.requests: list[tuple[str, str | None, int]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def simple(self) -> str:
        return f"{self.url}/simple/"

    def close(self) -> None:
        self.shutdown()
        self.server_close()

"""A small HTTP proxy of our own on loopback in front of the test registry, to inject registry faults for real: no
mock of the registry, every request the proxy does not fault reaches the real registry and its answer comes back
unchanged but for `Connection: close` (each client connection carries one request, which keeps the relay simple and
lets Docker's and carry's clients reconnect as they would to a registry that closes).

For each request the head is read (method, target), the rules are asked in the order added, and the first that
matches and has uses left decides:

- `status`: answer that status (with `headers`, e.g. Retry-After or WWW-Authenticate), then read and drop the body;
- `drop`: relay `after` bytes of the body to the registry, then reset both connections (a dropped connection);
- `hold`: park the request (`Rule.reached` is set) until `Rule.release` is set, then reset it (a kill point: the
  test kills carry while the registry "thinks");
- no rule: relay to the registry.

Every request is logged (`Entry`: method, target, what was done, the status the client got), so that a test can
assert the order of a push (no tag PUT before every manifest and signature) and that a rerun writes nothing.
Everything is bounded: each connection thread gives up after `TIMEOUT_S` of silence, `close()` stops them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator

TIMEOUT_S = 120.0
HEAD_LIMIT = 64 * 1024
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclasses.dataclass
class Rule:
    """Which requests (`method`, a regex searched in the target), how many of them to let through first (`skip`)
    and to fault (`times`, None: every one), and how."""

    action: str  # status | drop | hold
    method: str | None = None
    path: str = ""
    status: int = 503
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    times: int | None = 1
    skip: int = 0
    after: int = 0  # drop: body bytes relayed first
    seen: int = 0
    used: int = 0
    reached: threading.Event = dataclasses.field(default_factory=threading.Event)
    release: threading.Event = dataclasses.field(default_factory=threading.Event)

    def take(self, method: str, target: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        if not re.search(self.path, target):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.used >= self.times):
            return False
        self.used += 1
        return True


@dataclasses.dataclass(frozen=True)
class Entry:
    method: str
    target: str
    action: str  # relayed | status | drop | hold
    status: int | None
    at: float

    @property
    def write(self) -> bool:
        return self.method in WRITES


class FaultProxy:
    """`FaultProxy(upstream)` listens on 127.0.0.1:<port> (`.address`) and relays to `upstream` (`host:port`)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._rules: list[Rule] = []
        self.log: list[Entry] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    # -- the test's side -------------------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """No rule any more; every held request released (reset)."""
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            rule.release.set()

    def mark(self) -> int:
        """The log's length now: `since(mark)` is what came after."""
        with self._lock:
            return len(self.log)

    def since(self, mark: int) -> list[Entry]:
        with self._lock:
            return list(self.log[mark:])

    def close(self) -> None:
        self._stop.set()
        self.clear()
        self._accepting.join(5)
        self._server.close()
        for thread in self._threads:
            thread.join(5)

    # -- the relay -------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(TIMEOUT_S)
        with contextlib.closing(client):
            try:
                head, rest = _read_head(client)
            except OSError:
                return
            if head is None:
                return
            method, target = _request_line(head)
            with self._lock:
                rule = next((r for r in self._rules if r.take(method, target)), None)
            action = rule.action if rule is not None else "relayed"
            status: int | None = None
            try:
                if rule is None:
                    status = self._relay(client, head, rest)
                elif rule.action == "status":
                    status = rule.status
                    _answer(client, rule.status, rule.headers)
                    _drain(client)
                elif rule.action == "drop":
                    self._relay(client, head, rest, cut_after=rule.after)
                else:  # hold
                    rule.reached.set()
                    rule.release.wait(TIMEOUT_S)
                    _reset(client)
            except OSError:
                pass
            with self._lock:
                self.log.append(Entry(method, target, action, status, time.monotonic()))

    def _relay(self, client: socket.socket, head: bytes, rest: bytes, cut_after: int | None = None) -> int | None:
        """The request to the registry and its answer back; with `cut_after`, both connections reset after that
        many body bytes reached the registry. The status the client got (None when cut)."""
        upstream = socket.create_connection(self.upstream, timeout=TIMEOUT_S)
        with contextlib.closing(upstream):
            upstream.sendall(_with_close(head) + (rest if cut_after is None else rest[:cut_after]))
            if cut_after is not None:
                sent = min(len(rest), cut_after)
                while sent < cut_after:
                    chunk = client.recv(min(65536, cut_after - sent))
                    if not chunk:
                        break
                    upstream.sendall(chunk)
                    sent += len(chunk)
                _reset(client)
                _reset(upstream)
                return None
            pump = threading.Thread(target=_pump, args=(client, upstream), daemon=True)
            pump.start()
            answer, more = _read_head(upstream)
            if answer is None:
                return None
            client.sendall(_with_close(answer) + more)
            while chunk := upstream.recv(65536):
                client.sendall(chunk)
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)
            return int(answer.split(b" ", 2)[1])


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    """(the head up to its blank line, the bytes read after it); (None, b"") when the peer closed first, or began
    a TLS handshake (Docker tries HTTPS first on a loopback registry: closed at once, it falls back to HTTP)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk or (not data and chunk[:1] == b"\x16"):
            return None, b""
        data += chunk
        if len(data) > HEAD_LIMIT:
            raise OSError("head too long")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _request_line(head: bytes) -> tuple[str, str]:
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    return parts[0], parts[1] if len(parts) > 1 else ""


def _with_close(head: bytes) -> bytes:
    """The head with `Connection: close` (one request per connection)."""
    lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """The rest of the client's request body to the registry, until either side closes."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)


def _answer(client: socket.socket, status: int, headers: dict[str, str]) -> None:
    body = b'{"errors":[{"code":"UNAVAILABLE","message":"injected by the test\'s fault proxy"}]}'
    lines = [f"HTTP/1.1 {status} Injected", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()] + ["Connection: close"]
    client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)


def _drain(client: socket.socket) -> None:
    """Read and drop what the client still sends (the body), until it closes or goes quiet."""
    client.settimeout(10)
    with contextlib.suppress(OSError):
        while client.recv(65536):
            pass


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (no orderly FIN): the peer sees the connection drop."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


@contextlib.contextmanager
def closed_port() -> Iterator[str]:
    """`127.0.0.1:<port>` on which nothing listens (a registry that is down)."""
    probe = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    yield address


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """`127.0.0.1:<port>` that accepts connections and never answers (a registry that hangs)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()

"""Watch every process's command line while a block runs: secrets must never show up in argv.

The kernel tells us about each exec (the process events connector: a netlink socket, NETLINK_CONNECTOR /
CN_IDX_PROC, which needs root), and the watcher reads that process's /proc/PID/cmdline as the event arrives; the
processes already running are read once when the block starts and once when it ends. Nothing polls: the watcher
sleeps in recv() until the kernel has something to say (reading /proc every millisecond, as this module did, kept
most of a core busy on a 2-core machine during image builds). A process that execs and exits before its event is
read is missed, as it was by polling; if the socket's buffer ever overflows, /proc is read once more in full and
the number of overflows is kept in `Seen.overflows`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
NLMSG_DONE = 3
PROC_EVENT_EXEC = 0x00000002
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
PROC_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns; then the event's union
EXEC_EVENT = struct.Struct("=II")  # process_pid, process_tgid
SO_RCVBUFFORCE = 33
BUFFER_BYTES = 16 << 20


class Seen(set):
    """The distinct command lines seen (a set of str), and how often the kernel's buffer overflowed."""

    overflows = 0


def _cmdline(pid: int | str) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace") if raw else None


def _scan(seen: set[str]) -> None:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            line = _cmdline(entry.name)
            if line:
                seen.add(line)


def _control(sock: socket.socket, op: int) -> None:
    payload = struct.pack("=I", op)
    message = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    sock.send(NLMSG_HDR.pack(NLMSG_HDR.size + len(message), NLMSG_DONE, 0, 0, os.getpid()) + message)


def _open() -> socket.socket:
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    except OSError as error:
        raise RuntimeError(f"procwatch: no process events connector here ({error}); needs CONFIG_PROC_EVENTS") from None
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, BUFFER_BYTES)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
        sock.bind((0, CN_IDX_PROC))
        _control(sock, PROC_CN_MCAST_LISTEN)
    except OSError as error:
        sock.close()
        raise RuntimeError(f"procwatch: cannot listen to process events ({error}); this needs root") from None
    return sock


def _exec_pids(data: bytes) -> Iterator[int]:
    offset = 0
    while offset + NLMSG_HDR.size <= len(data):
        length = NLMSG_HDR.unpack_from(data, offset)[0]
        if length < NLMSG_HDR.size:
            return
        body = offset + NLMSG_HDR.size + CN_MSG.size
        if body + PROC_EVENT.size + EXEC_EVENT.size <= offset + length:
            what = PROC_EVENT.unpack_from(data, body)[0]
            if what == PROC_EVENT_EXEC:
                yield EXEC_EVENT.unpack_from(data, body + PROC_EVENT.size)[0]
        offset += (length + 3) & ~3


def _listen(sock: socket.socket, seen: Seen, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError as error:
            if error.errno == errno.ENOBUFS:  # events were lost: read everything that runs now
                seen.overflows += 1
                _scan(seen)
                continue
            if stop.is_set():
                return
            raise
        for pid in _exec_pids(data):
            line = _cmdline(pid)
            if line:
                seen.add(line)


@contextlib.contextmanager
def command_lines() -> Iterator[set[str]]:
    """The distinct command lines of all processes seen while the block runs: those running when it starts and
    ends, and every program exec'd in between (told by the kernel)."""
    seen = Seen()
    sock = _open()
    sock.settimeout(0.2)  # how soon the watcher notices the block ended; it wakes at once for an event
    stop = threading.Event()
    watcher = threading.Thread(target=_listen, args=(sock, seen, stop), daemon=True)
    watcher.start()
    _scan(seen)
    try:
        yield seen
    finally:
        _scan(seen)
        stop.set()
        watcher.join()
        with contextlib.suppress(OSError):
            _control(sock, PROC_CN_MCAST_IGNORE)
        sock.close()

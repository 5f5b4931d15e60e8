"""The pytest plugin `suite` loads into the upstream's own test run (`-p carry_suite_plugin`, from a copy of this
file). It runs in the interpreter of the environment under test, not carry's: it imports the standard library and
pytest only, and never carry.

It writes one JSON object a line to $CARRY_SUITE_EVENTS, flushed as it goes (a run killed half-way leaves what it
had): `configured` (the markers the run registers, and those the -m expression names that none registers: then the
run stops as a usage error), `collected` (the selected test ids), `collect-error` (a module that does not import),
`start` (a test begins: names the one a crash took), `report` (each setup/call/teardown outcome), and `finished`
(the exit status, and for each module of $CARRY_SUITE_MODULES the file it was imported from and its distribution's
version). With pytest-xdist only the controller writes (the workers' reports reach it).

At import it also refuses network connections to anything but this machine: `socket.connect` to a non-loopback
address and name look-ups of other hosts raise OSError, so a test that needs the network fails, saying so, instead
of reaching it.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import socket
import sys
from typing import Any

import pytest

EVENTS = os.environ.get("CARRY_SUITE_EVENTS", "")
MODULES = tuple(name for name in os.environ.get("CARRY_SUITE_MODULES", "").split(",") if name)
DIST = os.environ.get("CARRY_SUITE_DIST", "")
MESSAGE_CHARS = 600
KEYWORDS = {"and", "or", "not", "True", "False", "None"}
LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", ""}


class _State:
    config: Any = None
    handle: Any = None


def _emit(event: str, **fields: Any) -> None:
    if not EVENTS or hasattr(_State.config, "workerinput"):  # an xdist worker: the controller writes
        return
    if _State.handle is None:
        _State.handle = open(EVENTS, "a", encoding="utf-8")  # noqa: SIM115 - open for the run, closed at exit
    _State.handle.write(json.dumps({"event": event, **fields}) + "\n")
    _State.handle.flush()


# --- no network ---------------------------------------------------------------------------------------------------


def _local(host: Any) -> bool:
    if host is None or (
        isinstance(host, (str, bytes)) and (host.decode() if isinstance(host, bytes) else host).lower() in LOCAL_NAMES
    ):
        return True
    try:
        address = ipaddress.ip_address(host.decode() if isinstance(host, bytes) else str(host).split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        raise OSError(errno.ENETUNREACH, f"carry suite: no network here (only this machine): {address[0]}")
    return _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        return errno.ENETUNREACH
    return _connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _local(host):
        raise socket.gaierror(socket.EAI_NONAME, f"carry suite: no network here (only this machine): {host}")
    return _getaddrinfo(host, *args, **kwargs)


if os.environ.get("CARRY_SUITE_NETWORK") == "off":
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign,assignment]
    socket.getaddrinfo = _guarded_getaddrinfo


# --- markers ------------------------------------------------------------------------------------------------------


def marker_names(expression: str) -> set[str]:
    """The marker names a -m expression uses (`a and not (b or c(x=1))` -> {a, b, c}): its identifiers, without the
    operators and without the arguments of a marker call."""
    without_args = re.sub(r"\([^()]*=[^()]*\)", "", expression)
    return {word for word in re.findall(r"[A-Za-z_][\w.-]*", without_args) if word not in KEYWORDS}


def registered(config: Any) -> set[str]:
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in config.getini("markers")}


@pytest.hookimpl(trylast=True)
def pytest_configure(config: Any) -> None:
    _State.config = config
    known = registered(config)
    expression = config.option.markexpr or ""
    unknown = sorted(marker_names(expression) - known)
    _emit("configured", markers=sorted(known), unknown_markers=unknown, python=sys.version.split()[0])
    if unknown:
        raise pytest.UsageError(f"carry suite: marker(s) {', '.join(unknown)} are registered by nothing in this run")


# --- collection ---------------------------------------------------------------------------------------------------


def _message(report: Any) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2])[:MESSAGE_CHARS]
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = str(crash.message)
    else:
        lines = [line for line in str(longrepr).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("E ")]
        text = (errors or lines or [""])[-1]
    return " ".join(text.split())[:MESSAGE_CHARS]


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _emit("collect-error", id=report.nodeid, message=_message(report))


def pytest_collection_finish(session: Any) -> None:
    _emit("collected", ids=[item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    if not getattr(_State, "xdist_collected", False):
        _State.xdist_collected = True  # type: ignore[attr-defined]
        _emit("collected", ids=list(ids))


# --- running ------------------------------------------------------------------------------------------------------


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _emit("start", id=nodeid)


def pytest_runtest_logreport(report: Any) -> None:
    _emit(
        "report",
        id=report.nodeid,
        when=report.when,
        outcome=report.outcome,
        xfail=hasattr(report, "wasxfail"),
        duration=round(float(report.duration), 4),
        message="" if report.passed else _message(report),
    )


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    modules = {name: getattr(sys.modules.get(name), "__file__", None) for name in MODULES}
    version = None
    if DIST:
        from importlib import metadata

        try:
            version = metadata.version(DIST)
        except metadata.PackageNotFoundError:
            version = None
    _emit("finished", exitstatus=int(exitstatus), modules=modules, version=version)

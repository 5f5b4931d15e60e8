"""The one way carry runs another program (git, pip, uv, docker, nvcc, a test command): `execute`, an argument list
(never a shell) and always a timeout (PROBE_S, NETWORK_S or BUILD_S).

- Past the timeout, or on Ctrl-C, the program and every process it started are killed, and `TimedOut` (both
  `TimeoutExpired` and carry's `Failed`) or the KeyboardInterrupt goes on to the caller.
- The program stays in carry's own process group, so whoever kills carry's group kills it too; its tree is therefore
  killed by reading /proc, each process stopped first (so none forks or is reparented while it is read).
- argv appears in messages without the user:password@ of any URL in it (carry.util.redact).
- `english=True` where carry parses what the program says (LC_ALL=C, LANG=C).
- Output is captured, or with `log` streamed into that file as it comes (stderr with stdout), for long builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from carry.util import redact
from carry.util.errors import Failed

PROBE_S = 60  # `--version`, a query, a short local command
NETWORK_S = 3600  # a download, a resolve, a push
BUILD_S = 24 * 3600  # a wheel or image build: hours on a slow machine or under emulation, never forever
ENGLISH = {"LANGUAGE": "C", "LC_ALL": "C", "LANG": "C"}


class TimedOut(subprocess.TimeoutExpired, Failed):
    """A program ran past its timeout and was killed, with everything it started; `cmd` is argv as shown."""

    def __str__(self) -> str:
        words = [str(word) for word in self.cmd]
        shown = " ".join([os.path.basename(words[0]), *words[1:3], *(["…"] if len(words) > 3 else [])])
        return f"`{shown}` ran past its {self.timeout:g} s and was killed"


def execute(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | str | Path | None = None,
    log: IO[Any] | None = None,
    text: bool = False,
    english: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """Run `argv` and wait at most `timeout` seconds; its exit status and output. `stdin`: bytes, str, a file's path,
    or None (/dev/null). `env`: its whole environment (None: carry's). OSError when the program cannot start."""
    shown = [redact.credentials(os.fspath(arg)) for arg in argv]
    environ = None if env is None and not english else {**(os.environ if env is None else env)}
    if english and environ is not None:
        environ.update(ENGLISH)
    data = stdin if isinstance(stdin, (bytes, str)) else None
    with contextlib.ExitStack() as stack:
        source: Any = subprocess.PIPE if data is not None else subprocess.DEVNULL
        if isinstance(stdin, Path):
            source = stack.enter_context(open(stdin, "rb"))
        process = stack.enter_context(
            subprocess.Popen(
                [os.fspath(arg) for arg in argv],
                cwd=cwd,
                env=environ,
                stdin=source,
                stdout=log if log is not None else subprocess.PIPE,
                stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
                text=text,
            )
        )
        try:
            out, err = process.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            out, err = process.communicate()
            raise TimedOut(shown, timeout, out, err) from None
        except BaseException:  # Ctrl-C (KeyboardInterrupt), or anything else while it runs: it does not outlive us
            kill_tree(process.pid)
            process.wait()
            raise
    return subprocess.CompletedProcess(shown, process.returncode, out, err)


@dataclasses.dataclass(frozen=True)
class Spawned:
    """A program started by `spawn` that runs beside carry until `wait` (bounded by its timeout) or `kill`."""

    process: subprocess.Popen
    deadline: float  # time.monotonic() past which `wait` kills it
    own_group: bool

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self) -> int | None:
        """Its exit status; None when it ran past its timeout, and was killed with everything it started."""
        try:
            return self.process.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL it and what it started; with its own process group, also what left the tree (a daemon)."""
        if self.own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        kill_tree(self.process.pid)
        self.process.wait()


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    log: IO[Any],
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    own_group: bool = False,
) -> Spawned:
    """Start `argv` and return at once, its output streamed into `log`, nothing on its stdin. `own_group`: in a group
    of its own, so that `kill` reaches what it daemonised too. The caller `wait`s (at most `timeout`) or `kill`s."""
    process = subprocess.Popen(
        [os.fspath(arg) for arg in argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=own_group,
    )
    return Spawned(process, time.monotonic() + timeout, own_group)


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process it started, found through /proc (their parent links): each stopped first,
    until no new one appears, so that none forks or is reparented away while the tree is read."""
    stopped: set[int] = set()
    while True:
        found = {pid, *_descendants(pid)} - stopped
        if not found:
            break
        for member in found:
            _signal(member, signal.SIGSTOP)
        stopped |= found
    for member in stopped:
        _signal(member, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, number)

"""carry's one output channel: the reporter that every module prints its progress through.

A module calls `reporter.phase(name, detail)` (`[  12.3s] name: detail` on stderr), `reporter.note(line)`,
`reporter.warn(line)` or `reporter.bar(name, total, ...)` where what it says arises; nothing returns lines for a
caller to print. The reporter is held in a context variable: the command line installs one per command, a test
installs its own with `using(Reporter(...))`, `silenced()` keeps a block quiet and `recording()` keeps what it said;
by default one prints to stderr. A new thread does not inherit it: work handed to a pool goes through `carried(fn)`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TextIO, TypeVar

from carry.util.progress import Progress

T = TypeVar("T")

# The bytes from which moving data is long work that says each quarter (a download, a layer written): below it a
# user waits seconds, and the work's one line at its end is enough (what the tests of small files read).
BAR_FROM_BYTES = 64 * 1000 * 1000


class Reporter:
    """Timed phase lines, notes and warnings; each line said is also kept (`name: detail`, or the note) in `heard`."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self._lines = Progress(stream, quiet)
        self.heard: tuple[list[str], ...] = ()

    @property
    def quiet(self) -> bool:
        return self._lines.quiet

    def elapsed(self) -> float:
        return self._lines.elapsed()

    def phase(self, name: str, detail: str = "") -> None:
        for kept in self.heard:
            kept.append(f"{name}: {detail}")
        self._lines.phase(name, detail)

    def note(self, line: str) -> None:
        for kept in self.heard:
            kept.append(line)
        if not self.quiet:
            print(f"carry: {line}", file=self._lines.stream, flush=True)

    def warn(self, line: str) -> None:
        self.note(f"warning: {line}")

    def bar(
        self, name: str, total: float, unit: str = "", *, minimum: float = 0, done: float = 0, shown: str = ""
    ) -> Bar:
        """A hook for long work of a known size: `advance(n)` as it goes; a phase line at each quarter. Work smaller
        than `minimum` says nothing; `done` is what was done before it began; `shown` is the total in words."""
        return Bar(self, name, total if total >= minimum else 0, unit, done, shown)

    def child(self, *, quiet: bool | None = None, keep: list[str] | None = None) -> Reporter:
        """The same clock and stream, quiet or not, and one recording more."""
        made = Reporter(self._lines.stream, self.quiet if quiet is None else quiet)
        made._lines.start = self._lines.start
        made.heard = (*self.heard, keep) if keep is not None else self.heard
        return made


class Relay(Reporter):
    """A reporter for a script outside carry (examples/*/make_upstream.py): each phase's detail and note to `line`."""

    def __init__(self, line: Callable[[str], None]) -> None:
        super().__init__()
        self._line = line

    def phase(self, name: str, detail: str = "") -> None:
        for kept in self.heard:
            kept.append(f"{name}: {detail}")
        self._line(detail)

    def note(self, line: str) -> None:
        for kept in self.heard:
            kept.append(line)
        self._line(line)


class Holding(Reporter):
    """A reporter whose phase lines wait until `release`; those never released are dropped (a failure stays alone)."""

    def __init__(self, parent: Reporter) -> None:
        super().__init__(parent._lines.stream, parent.quiet)
        self._lines.start = parent._lines.start
        self.heard = parent.heard
        self.waiting: list[tuple[str, str]] | None = []

    def phase(self, name: str, detail: str = "") -> None:
        if self.waiting is None:
            super().phase(name, detail)
        else:
            self.waiting.append((name, detail))

    def release(self) -> None:
        waiting, self.waiting = self.waiting or [], None
        for name, detail in waiting:
            super().phase(name, detail)


class Bar:
    """Progress of long work: a phase line `name: 50% of 1.2 GB` at each quarter; none where the total is 0. Work in
    another thread may advance it (it holds its reporter)."""

    STEPS = 4

    def __init__(self, owner: Reporter, name: str, total: float, unit: str, done: float = 0, shown: str = "") -> None:
        self.owner, self.name, self.total, self.unit = owner, name, total, unit
        self.shown = shown or f"{total:g}{unit}"
        self.done = float(done)
        self._shown = self._step()

    def _step(self) -> int:
        return min(self.STEPS, int(self.done / self.total * self.STEPS)) if self.total > 0 else 0

    def advance(self, amount: float) -> None:
        self.done += amount
        if self.total <= 0:
            return
        step = self._step()
        if step > self._shown:
            self._shown = step
            self.owner.phase(self.name, f"{step * 100 // self.STEPS}% of {self.shown}")


_CURRENT: contextvars.ContextVar[Reporter] = contextvars.ContextVar("carry_reporter")
_default: list[Reporter] = []


def current() -> Reporter:
    """The reporter of this context; where none was installed, the process's default (stderr, not quiet)."""
    found = _CURRENT.get(None)
    if found is not None:
        return found
    if not _default:
        _default.append(Reporter())
    return _default[0]


@contextlib.contextmanager
def using(installed: Reporter) -> Iterator[Reporter]:
    """`installed` answers for the block (and for the work it hands on through `carried`)."""
    token = _CURRENT.set(installed)
    try:
        yield installed
    finally:
        _CURRENT.reset(token)


def silenced() -> contextlib.AbstractContextManager[Reporter]:
    """Nothing printed in the block (recordings still keep their lines)."""
    return using(current().child(quiet=True))


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """The block's lines (`name: detail`; notes as they are) kept in the list it yields, and printed as before."""
    kept: list[str] = []
    with using(current().child(keep=kept)):
        yield kept


def holding() -> contextlib.AbstractContextManager[Reporter]:
    """The block's phase lines held back until the yielded reporter's `release()` (a Holding)."""
    return using(Holding(current()))


def carried(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` to run in another thread with this context's reporter (each call in its own copy of the context)."""
    context = contextvars.copy_context()

    def run(*args: object, **kwargs: object) -> T:
        return context.copy().run(fn, *args, **kwargs)

    return run


def phase(name: str, detail: str = "") -> None:
    current().phase(name, detail)


def note(line: str) -> None:
    current().note(line)


def warn(line: str) -> None:
    current().warn(line)


def bar(name: str, total: float, unit: str = "", *, minimum: float = 0, done: float = 0, shown: str = "") -> Bar:
    """The current reporter's bar (see Reporter.bar)."""
    return current().bar(name, total, unit, minimum=minimum, done=done, shown=shown)

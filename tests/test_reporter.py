"""carry.util.reporter, the one output channel: the phase line's format, quiet, notes, what a block installs
(using, silenced, recording, holding) and work handed to threads (carried)."""

from __future__ import annotations

import io
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from carry.util import reporter

LINE = re.compile(r"^\[ *\d+\.\ds\] ")


def _lines(stream: io.StringIO) -> list[str]:
    return [LINE.sub("", line) for line in stream.getvalue().splitlines()]


def test_a_phase_line_is_elapsed_name_and_detail_and_a_note_is_carry_s():
    stream = io.StringIO()
    with reporter.using(reporter.Reporter(stream)):
        reporter.phase("build", "PEP 517 build_wheel")
        reporter.phase("done")
        reporter.note("the PR head was not checked")
        reporter.warn("offline")
    text = stream.getvalue().splitlines()
    assert re.fullmatch(r"\[ {4}0\.\ds\] build: PEP 517 build_wheel", text[0]), text
    assert re.fullmatch(r"\[ {4}0\.\ds\] done", text[1]), text  # no detail: no trailing colon
    assert text[2:] == ["carry: the PR head was not checked", "carry: warning: offline"]


def test_the_installed_reporter_answers_only_inside_its_block():
    inner, outer = io.StringIO(), io.StringIO()
    with reporter.using(reporter.Reporter(outer)):
        with reporter.using(reporter.Reporter(inner)):
            reporter.phase("a", "inside")
        reporter.phase("b", "after")
    assert _lines(inner) == ["a: inside"] and _lines(outer) == ["b: after"]


def test_quiet_and_silenced_print_nothing_but_recordings_keep_the_lines():
    stream = io.StringIO()
    with reporter.using(reporter.Reporter(stream, quiet=True)):
        reporter.phase("a", "quiet")
    with reporter.using(reporter.Reporter(stream)), reporter.recording() as kept, reporter.silenced():
        reporter.phase("b", "silenced")
        reporter.note("a note")
    assert stream.getvalue() == "" and kept == ["b: silenced", "a note"]


def test_a_recording_keeps_the_clock_and_prints_as_before():
    stream = io.StringIO()
    outer = reporter.Reporter(stream)
    with reporter.using(outer), reporter.recording() as kept:
        assert reporter.current().elapsed() >= outer.elapsed() - 1e-3  # the same start
        reporter.phase("cache", "hit")
    assert kept == ["cache: hit"] and _lines(stream) == ["cache: hit"]


def test_held_lines_wait_for_release_and_are_dropped_without_it():
    stream = io.StringIO()
    with reporter.using(reporter.Reporter(stream)):
        with reporter.holding() as held:
            reporter.phase("suite", "one")
            assert stream.getvalue() == ""
            assert isinstance(held, reporter.Holding)
            held.release()
            reporter.phase("suite", "two")
        with reporter.holding():
            reporter.phase("suite", "never")
    assert _lines(stream) == ["suite: one", "suite: two"]


def test_work_carried_to_a_thread_reports_to_the_submitting_context():
    stream = io.StringIO()
    main_thread = threading.get_ident()
    with reporter.using(reporter.Reporter(stream)), reporter.recording() as kept:

        def one(n: int) -> int:
            assert threading.get_ident() != main_thread
            reporter.phase("base", f"platform {n}")
            return n

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(reporter.carried(one), [1, 2, 3])) == [1, 2, 3]
    assert sorted(_lines(stream)) == ["base: platform 1", "base: platform 2", "base: platform 3"]
    assert sorted(kept) == sorted(_lines(stream))
    # not carried: the thread sees no installed reporter (the process's default)
    with reporter.using(reporter.Reporter(stream)), ThreadPoolExecutor(1) as pool:
        assert pool.submit(reporter.current).result() is not reporter.current()


def test_a_bar_says_each_quarter_once():
    stream = io.StringIO()
    with reporter.using(reporter.Reporter(stream)):
        bar = reporter.current().bar("download", 1000, " B")
        for _ in range(10):
            bar.advance(100)
        reporter.current().bar("download", 0).advance(5)  # no size known: nothing said
    assert _lines(stream) == [f"download: {p}% of 1000 B" for p in (25, 50, 75, 100)]


def test_a_bar_below_its_minimum_says_nothing_and_a_resumed_one_only_what_is_left():
    stream = io.StringIO()
    with reporter.using(reporter.Reporter(stream)):
        small = reporter.bar("download", 999, " B", minimum=1000)
        small.advance(999)
        resumed = reporter.bar("download", 1000, minimum=1000, done=600, shown="1.0 kB a.whl")
        for _ in range(4):
            resumed.advance(100)
    assert _lines(stream) == ["download: 75% of 1.0 kB a.whl", "download: 100% of 1.0 kB a.whl"]

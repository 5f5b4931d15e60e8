"""carry.util.run, the one runner, on real processes: a timeout or Ctrl-C kills the program and what it started,
the program stays in carry's process group, argv loses its credentials in messages, the English environment, the
forms of stdin and of output (captured, or streamed into a log)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from carry.util.errors import Failed
from carry.util.run import ENGLISH, TimedOut, execute, kill_tree, spawn

# A shell that starts a grandchild (a long sleep), writes its pid, and waits for it.
GRANDCHILD = 'sleep 300 & echo $! > "$1"; wait'


def _alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def test_a_timeout_kills_the_program_and_what_it_started(tmp_path):
    pidfile = tmp_path / "pid"
    began = time.monotonic()
    with pytest.raises(TimedOut) as raised:
        execute(["sh", "-c", GRANDCHILD, "sh", str(pidfile)], timeout=1)
    assert time.monotonic() - began < 10
    grandchild = int(pidfile.read_text())
    assert _gone(grandchild), f"the grandchild {grandchild} outlived the timeout"
    # both subprocess's and carry's: callers that catch either keep working, and main prints it in one line
    assert isinstance(raised.value, subprocess.TimeoutExpired) and isinstance(raised.value, Failed)
    assert str(raised.value) == '`sh -c sleep 300 & echo $! > "$1"; wait …` ran past its 1 s and was killed'


def test_ctrl_c_kills_the_program_and_what_it_started(tmp_path):
    pidfile = tmp_path / "pid"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            execute(["sh", "-c", GRANDCHILD, "sh", str(pidfile)], timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _gone(int(pidfile.read_text()))


def test_the_program_stays_in_carry_s_process_group():
    """So that killing carry's group (a supervisor, tests/test_crash.py) kills it too."""
    done = execute(["sh", "-c", "ps -o pgid= -p $$"], text=True, timeout=30)
    assert int(done.stdout) == os.getpgrp()


def test_kill_tree_reaches_every_generation(tmp_path):
    pidfile = tmp_path / "pid"
    process = subprocess.Popen(["sh", "-c", f"sh -c '{GRANDCHILD}' sh {pidfile}; wait"])
    deadline = time.monotonic() + 10
    while not pidfile.is_file() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    kill_tree(process.pid)
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert _gone(int(pidfile.read_text()))


def test_argv_loses_its_credentials_in_messages():
    url = "https://carry-user:s3cret@registry.invalid/v2/"
    done = execute(["echo", url], text=True, timeout=30)
    assert done.stdout.strip() == url  # the program itself gets argv as given
    assert done.args == ["echo", "https://registry.invalid/v2/"]
    with pytest.raises(TimedOut) as raised:
        execute(["sh", "-c", "sleep 30", url], timeout=0.5)
    assert "s3cret" not in str(raised.value) and "s3cret" not in repr(raised.value.cmd)
    failed = execute(["sh", "-c", "exit 3", url], timeout=30)
    with pytest.raises(subprocess.CalledProcessError) as error:
        failed.check_returncode()
    assert "s3cret" not in str(error.value) and "exit status 3" in str(error.value)


def test_english_where_output_is_parsed():
    said = execute(["sh", "-c", 'echo "$LC_ALL $LANG $LANGUAGE $KEPT"'], text=True, timeout=30, english=True)
    assert said.stdout.split() == [ENGLISH["LC_ALL"], ENGLISH["LANG"], ENGLISH["LANGUAGE"]]
    given = execute(["sh", "-c", 'echo "$LC_ALL $KEPT"'], env={"KEPT": "yes"}, text=True, timeout=30, english=True)
    assert given.stdout.split() == ["C", "yes"]
    plain = execute(["sh", "-c", 'echo "${LC_ALL:-unset}"'], env={"PATH": os.environ["PATH"]}, text=True, timeout=30)
    assert plain.stdout.strip() == "unset"


def test_stdin_as_bytes_text_a_file_or_nothing(tmp_path):
    assert execute(["cat"], stdin=b"bytes\x00", timeout=30).stdout == b"bytes\x00"
    assert execute(["cat"], stdin="text", text=True, timeout=30).stdout == "text"
    (tmp_path / "in").write_bytes(b"from a file")
    assert execute(["cat"], stdin=tmp_path / "in", timeout=30).stdout == b"from a file"
    assert execute(["cat"], timeout=30).stdout == b""  # /dev/null: never the terminal


def test_output_captured_or_streamed_into_a_log(tmp_path):
    done = execute(["sh", "-c", "echo out; echo err >&2; exit 4"], text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err\n")
    log = tmp_path / "build.log"
    with open(log, "ab") as handle:
        handle.write(b"== header\n")
        handle.flush()
        streamed = execute(["sh", "-c", "echo out; echo err >&2"], log=handle, timeout=30)
    assert streamed.returncode == 0 and streamed.stdout is None
    assert log.read_text() == "== header\nout\nerr\n"


def test_a_program_that_cannot_start_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        execute([str(tmp_path / "no-such-program")], timeout=30)


def test_a_spawned_program_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    pidfile = tmp_path / "pid"
    with open(tmp_path / "log", "wb") as log:
        spawned = spawn(["sh", "-c", GRANDCHILD, "sh", str(pidfile)], timeout=1, log=log)
    assert spawned.poll() is None  # it runs beside us
    began = time.monotonic()
    assert spawned.wait() is None  # past its timeout: killed
    assert time.monotonic() - began < 5
    assert spawned.poll() == -signal.SIGKILL
    assert _gone(int(pidfile.read_text()))


def test_a_spawned_program_in_its_own_group_takes_what_it_daemonised_along(tmp_path):
    """A daemon leaves the tree (its parent exits, init adopts it); only the group reaches it."""
    pidfile = tmp_path / "pid"
    daemon = '(sleep 300 & echo $! > "$1") & wait; echo "started"; sleep 300'
    with open(tmp_path / "log", "wb") as log:
        spawned = spawn(["sh", "-c", daemon, "sh", str(pidfile)], timeout=60, log=log, own_group=True)
    deadline = time.monotonic() + 5
    while not (tmp_path / "log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.getpgid(spawned.process.pid) != os.getpgrp()
    spawned.kill()
    assert spawned.poll() == -signal.SIGKILL
    assert _gone(int(pidfile.read_text()))


def test_a_spawned_program_that_ends_gives_its_status(tmp_path):
    with open(tmp_path / "log", "wb") as log:
        spawned = spawn(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30, log=log)
        assert spawned.wait() == 3
    assert (tmp_path / "log").read_text().split() == ["out", "err"]

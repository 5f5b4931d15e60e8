"""tests/procwatch.py: the kernel's process events show every exec'd command line, without polling /proc."""

from __future__ import annotations

import os
import subprocess
import time

from procwatch import command_lines


def test_an_execd_command_line_is_seen_and_the_watcher_idles():
    marker = "procwatch-marker-" + os.urandom(4).hex()
    started = time.process_time()
    with command_lines() as seen:
        subprocess.run(["sh", "-c", "sleep 0.05", marker], check=True)
        time.sleep(1)  # the watcher waits in recv(): it costs no CPU while nothing execs
    assert any(marker in line for line in seen), sorted(seen)[:20]
    assert f"sh -c sleep 0.05 {marker}" in {line.strip() for line in seen}
    assert time.process_time() - started < 0.5  # polling /proc every millisecond spent most of the second
    assert seen.overflows == 0

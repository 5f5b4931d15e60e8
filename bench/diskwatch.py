"""The disk a run uses: the largest drop of free space on the filesystems of some paths while it runs, sampled in a
thread (DiskWatch: bench/freshrunner.py, bench/lockedimage.py), or by this script until it is stopped (.ci/run):

    python3 bench/diskwatch.py [--every S] [--parent PID] [--explain DIR]... PATH...

which prints `ci: peak disk used X GB above the start at HH:MM:SS, M min into the run (Y GB free at the low point)`
when SIGTERM or SIGINT stops it, or when PID has gone; with `--explain DIR`, also what held the most near the peak:
the largest folders three levels below DIR (under pytest's temp root: pytest-N/popen-gwX/NAME, a test's, module's
or session's own dir, and pytest-N/shared/NAME), measured whenever the peak has grown by a GB since the last time, at
most once a minute. Each filesystem counts once; a path not made yet (Docker's data root before dockerd starts)
counts as its nearest existing parent's. Standard library only; a failed sample is skipped, never an error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

GB = 1e9


def size_of(path: Path) -> int:
    """Bytes on disk under `path` (each inode once)."""
    total, seen = 0, set()
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if stat.st_ino not in seen:
                seen.add(stat.st_ino)
                total += stat.st_blocks * 512
    return total


def largest(roots: tuple[Path, ...], count: int = 8) -> list[tuple[int, str]]:
    """The `count` largest folders three levels below `roots` (bytes, path), largest first; each once, by its real
    path (pytest's `pytest-current` is a link to the run's `pytest-N`)."""
    folders = {f.resolve() for root in roots for f in root.glob("*/*/*") if f.is_dir() and not f.is_symlink()}
    return sorted(((size_of(f), str(f)) for f in folders), reverse=True)[:count]


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class DiskWatch:
    """`peak`: the largest drop of free space on the filesystems of `paths` (summed) since it started, less what
    `remote` (the registry's storage: remote for a CI runner) grew by meanwhile, `peak_at` its seconds since
    `started` (the wall clock); `low`: the least free space seen. Sampled every `every` seconds while it runs, and once
    as it stops."""

    def __init__(self, *paths: Path, remote: Path | None = None, every: float = 1.0, explain: tuple[Path, ...] = ()):
        devices = {os.stat(found).st_dev: found for found in map(_existing, paths)}
        self.paths, self.remote, self.every, self.explain = list(devices.values()), remote, every, explain
        self.held: list[tuple[int, str]] = []  # (bytes, folder): the largest under `explain` near the peak
        self.explained, self.held_at = 0, 0.0  # the peak when `held` was measured, and when
        self.start_free = self.low = self._free()
        self.start_remote = size_of(remote) if remote else 0
        self.peak, self.peak_at, self.started = 0, 0.0, time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _free(self) -> int:
        return sum(shutil.disk_usage(path).free for path in self.paths)

    def sample(self) -> None:
        try:
            free = self._free()
            grown = size_of(self.remote) - self.start_remote if self.remote else 0
        except OSError:
            return
        self.low = min(self.low, free)
        used = self.start_free - free - grown
        if used > self.peak:
            self.peak, self.peak_at = used, time.time() - self.started
            if self.explain and used > self.explained + GB and time.time() > self.held_at + 60:
                self.explained, self.held_at = used, time.time()
                self.held = largest(self.explain)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the peak disk used from now until stopped (SIGTERM).")
    parser.add_argument("paths", nargs="+", type=Path, help="a path on each filesystem to watch")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--parent", type=int, help="stop when this process has gone")
    parser.add_argument("--explain", type=Path, action="append", default=[], help="say what under DIR held the peak")
    args = parser.parse_args(argv)
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    try:
        with DiskWatch(*args.paths, every=args.every, explain=tuple(args.explain)) as disk:
            while not stopped.wait(args.every) and (args.parent is None or Path(f"/proc/{args.parent}").exists()):
                pass
        peak, low = disk.peak / GB, disk.low / GB
        at = time.strftime("%H:%M:%S", time.localtime(disk.started + disk.peak_at))
        print(
            f"ci: peak disk used {peak:.1f} GB above the start at {at}, {disk.peak_at / 60:.1f} min into the run "
            f"({low:.1f} GB free at the low point)",
            file=sys.stderr,
        )
        if disk.held:
            held = ", ".join(f"{size / GB:.1f} GB {path}" for size, path in disk.held)
            at = time.strftime("%H:%M:%S", time.localtime(disk.held_at))
            print(f"ci: the largest folders at {at} ({disk.explained / GB:.1f} GB used then): {held}", file=sys.stderr)
    except Exception as exc:  # a sampler never fails the run it watches
        print(f"ci: disk not measured ({exc})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

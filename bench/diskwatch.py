"""The disk a run uses: the largest drop of free space on the filesystems of some paths while it runs, sampled in a
thread (DiskWatch: bench/freshrunner.py, bench/lockedimage.py), or by this script until it is stopped (.ci/run):

    python3 bench/diskwatch.py [--every S] [--parent PID] PATH...

which prints `ci: peak disk used X GB above the start at HH:MM:SS, M min into the run (Y GB free at the low point)`
when SIGTERM or SIGINT stops it, or when PID has gone. Each filesystem counts once; a path not made yet (Docker's data
root before dockerd starts) counts as its nearest existing parent's. Standard library only; a failed sample is
skipped, never an error.
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

    def __init__(self, *paths: Path, remote: Path | None = None, every: float = 1.0):
        devices = {os.stat(found).st_dev: found for found in map(_existing, paths)}
        self.paths, self.remote, self.every = list(devices.values()), remote, every
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
    args = parser.parse_args(argv)
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    try:
        with DiskWatch(*args.paths, every=args.every) as disk:
            while not stopped.wait(args.every) and (args.parent is None or Path(f"/proc/{args.parent}").exists()):
                pass
        peak, low = disk.peak / GB, disk.low / GB
        at = time.strftime("%H:%M:%S", time.localtime(disk.started + disk.peak_at))
        print(
            f"ci: peak disk used {peak:.1f} GB above the start at {at}, {disk.peak_at / 60:.1f} min into the run "
            f"({low:.1f} GB free at the low point)",
            file=sys.stderr,
        )
    except Exception as exc:  # a sampler never fails the run it watches
        print(f"ci: disk not measured ({exc})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

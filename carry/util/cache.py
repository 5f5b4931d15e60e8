"""The cache directory: mirrors, bundles, build dirs, artifacts, logs and locks under `$CARRY_CACHE`."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util.digest import sha256
from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    import filelock

LOCK_TIMEOUT_S = 3600


@record
class Cache:
    root: Path

    @classmethod
    def from_env(cls) -> Cache:
        return cls(Path(os.environ.get("CARRY_CACHE") or Path.home() / ".cache" / "carry").absolute())

    def ensure_writable(self) -> None:
        """Fail early, with one line, when the cache cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cache dir {self.root} cannot be created ({exc.strerror}); set CARRY_CACHE") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise BadInput(f"cache dir {self.root} is not writable; set CARRY_CACHE to a writable directory")

    def mirror(self, url: str) -> Path:
        slug = re.sub(r"[^A-Za-z0-9]+", "-", url.rstrip("/").rsplit("/", 1)[-1]).strip("-")[:40] or "upstream"
        return self.root / "mirrors" / f"{slug}-{sha256(url.encode()).hexdigest()[:16]}.git"

    def bundle(self, commit: str) -> Path:
        return self.root / "bundles" / f"{commit}.bundle"

    @property
    def scratch(self) -> Path:
        return self.root / "tmp"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def builds(self) -> Path:
        return self.root / "build"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def lock_path(self, name: str) -> Path:
        return self.root / "locks" / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.lock"

    def lock(self, name: str) -> filelock.FileLock:
        """A cross-process lock named `name` (mirror, build dir, artifact key)."""
        import filelock  # here, not at import: `version` and `check` on a fetched mirror never lock

        path = self.lock_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(path), timeout=LOCK_TIMEOUT_S)

    @contextlib.contextmanager
    def held(self, name: str, phase: str) -> Iterator[None]:
        """The lock `name` held for the block; when another carry holds it, a `phase` line says that this run waits."""
        import filelock

        lock = self.lock(name)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            from carry.util import reporter

            reporter.phase(phase, f"waiting for another carry run, which holds the lock {lock.lock_file}")
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

"""What `prove` learned, kept beside the patches: which build.tests command each patch makes pass.

`prove` finds, by building every prefix of the series, that adding 0002 turns `python -m pkg.repro` from FAIL to
PASS: a fact about the patch, so it is written to `patches/PROVED.json` and committed with the patches, reaching every
machine that runs `status --test` (a CI runner has no cache of ours); `Carry-Test` trailers take precedence. Each
entry records the patch's sha256 and the GPU and date, so a reader sees when it was learned on an older text.

    {"format": 1, "patches": {"0002-x.patch": {"fixes": ["python -m pkg.repro"], "sha256": "…",
                                               "proved": "2026-12-01T10:00:00+00:00", "gpu": "…"}}}
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from carry.source.series import PROVED_NAME
from carry.util.errors import BadInput
from carry.util.fsutil import atomic_write_text

FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Learned:
    patch: str
    fixes: tuple[str, ...]  # build.tests commands as written
    sha256: str
    proved: str
    gpu: str


def path(directory: Path) -> Path:
    return directory / PROVED_NAME


def load(directory: Path) -> dict[str, Learned]:
    """patch name -> what prove learned about it; {} when prove never wrote the file."""
    where = path(directory)
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BadInput(f"{where}: not readable JSON ({exc}); delete it and run `prove` again") from None
    try:
        if data["format"] != FORMAT:
            raise BadInput(f"{where}: format {data['format']!r}, this carry reads {FORMAT}; run `prove` again")
        return {
            name: Learned(
                name, tuple(str(t) for t in entry["fixes"]), *(str(entry[k]) for k in ("sha256", "proved", "gpu"))
            )
            for name, entry in data["patches"].items()
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadInput(
            f"{where}: not a file `prove` wrote ({type(exc).__name__}: {exc}); delete it and run `prove` again"
        ) from None


def record(directory: Path, fixes: Mapping[str, Sequence[str]], sha256: Mapping[str, str], gpu: str) -> Path | None:
    """Write `fixes` (patch name -> the tests it makes pass) with each patch's `sha256` and the `gpu`, replacing what
    an earlier prove wrote; nothing is written when no patch fixes a test and no file is there yet."""
    where = path(directory)
    if not fixes and not where.exists():
        return None
    when = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    entries = {
        name: {"fixes": list(commands), "sha256": sha256[name], "proved": when, "gpu": gpu}
        for name, commands in sorted(fixes.items())
    }
    atomic_write_text(where, json.dumps({"format": FORMAT, "patches": entries}, indent=2) + "\n")
    return where

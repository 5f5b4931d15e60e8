#!/usr/bin/env python3
"""Download vLLM's pinned release files (releases.yaml: name, version, sha256) once into carry's download store,
from the package index pip is configured with; print each path.

    python examples/vllm/fetch.py [NAME ...]     every file, or only those named (e.g. vllm-0.33.0.tar.gz)

sha256-checked and resumable; exit 2 naming a file whose pin does not match, 1 when the network fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from carry.source import releases  # noqa: E402
from carry.util import reporter  # noqa: E402
from carry.util.errors import CarryError  # noqa: E402


def main(argv: list[str]) -> int:
    try:
        with reporter.using(reporter.Relay(lambda line: print(f"fetch: {line}", file=sys.stderr, flush=True))):
            paths = releases.fetch(Path(__file__).with_name("releases.yaml"), argv)
        for path in paths:
            print(path)
    except CarryError as exc:
        print(f"fetch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

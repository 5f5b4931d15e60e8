#!/usr/bin/env python3
"""Print one value of the validated build.yaml for the CI scripts, so no shell script parses YAML itself.

    python ci/carry_query.py KEY [--config build.yaml]

A list prints one item a line, a boolean prints true/false, an unset value prints nothing.
Exit 2 with one line on stderr for an unknown key or a bad config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from carry.config import Config, load  # noqa: E402
from carry.config.reader import public_url  # noqa: E402
from carry.util.cache import Cache  # noqa: E402
from carry.util.errors import CarryError  # noqa: E402

QUERIES = {
    "upstream.url": lambda c: public_url(c.upstream.url),
    "upstream.commit": lambda c: c.upstream.commit,
    "upstream.main": lambda c: c.upstream.main,
    "upstream.pr_ref": lambda c: c.upstream.pr_ref,
    "build.build_isolation": lambda c: c.build.build_isolation,
    "image.name": lambda c: c.image.name,
    "image.registry": lambda c: registry_host(c.image.name),
    "image.platforms": lambda c: [str(target.platform) for target in c.image.platforms],
    "cache.mirror": lambda c: Cache.from_env().mirror(c.upstream.url),
}


def registry_host(image_name: str) -> str:
    """The registry an image name points at; Docker Hub when the first part is not a host."""
    first, _, rest = image_name.partition("/")
    looks_like_host = rest and ("." in first or ":" in first or first == "localhost")
    return first if looks_like_host else "docker.io"


def render(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true\n" if value else "false\n"
    if isinstance(value, (tuple, list)):
        return "".join(f"{item}\n" for item in value)
    return f"{value}\n"


def query(config: Config, key: str) -> str:
    return render(QUERIES[key](config))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carry_query.py", description=__doc__.split("\n")[0])
    parser.add_argument("key")
    parser.add_argument("--config", type=Path, default=Path("build.yaml"))
    args = parser.parse_args(argv)
    if args.key not in QUERIES:
        print(f"carry_query: error: unknown key {args.key!r}; use one of: {', '.join(QUERIES)}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(query(load(args.config), args.key))
    except CarryError as exc:
        print(f"carry_query: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

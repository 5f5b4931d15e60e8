"""Provenance of the installed build, if the packager recorded any.

A packager may add a JSON file named carry-buildinfo.json to the wheel's
.dist-info directory; it is read back through the installed distribution's
metadata.
"""

import json
from importlib import metadata

BUILDINFO_NAME = "carry-buildinfo.json"


def load() -> dict | None:
    """Return the recorded build information, or None when there is none."""
    try:
        text = metadata.distribution("pledemo").read_text(BUILDINFO_NAME)
    except metadata.PackageNotFoundError:
        return None
    return json.loads(text) if text else None

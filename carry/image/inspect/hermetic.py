"""A hermetic Dockerfile build's SBOM: every distribution its runtime stage installed, read back from the image's
layers in the local engine and matched to a wheel file carry holds. The Dockerfile path hands this to the
attester (carry.image.attest) through the maker of both, so that neither imports verify's modules."""

from __future__ import annotations

import dataclasses
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING

from carry.image.attest import wheel_of
from carry.image.inspect import imagefs, installcheck
from carry.trust.facts import Wheel, canonical

if TYPE_CHECKING:
    import docker

    from carry.platforms import Platform

BUNDLED_WHEELS = ("/usr/share/python-wheels/",) + tuple(
    f"{prefix}/lib/python3.{minor}/ensurepip/_bundled/" for prefix in ("/usr", "/usr/local") for minor in range(8, 16)
)


def distributions(
    client: docker.DockerClient, ref: str, platform: Platform, fixed: Wheel, wheelhouse: dict[tuple[str, str], Wheel]
) -> tuple[tuple[Wheel, ...], str]:
    """The distributions a hermetic build's runtime stage installed (read from the engine's layers), each matched to its
    wheel: the fixed one, the wheelhouse's, or the base's bundled ensurepip wheels; ((), why not) for one unknown."""
    selection = imagefs.Selection(
        prefixes=(f"{installcheck.VENV}/", *BUNDLED_WHEELS),
        keep=lambda path: path.startswith(f"{installcheck.VENV}/lib/") and path.endswith(".dist-info/METADATA"),
    )
    files = imagefs.from_engine(client, ref, platform, selection)
    bundled = {}
    for path, node in files.nodes.items():
        if node.kind == "file" and path.endswith(".whl") and path.startswith(BUNDLED_WHEELS):
            try:
                wheel = dataclasses.replace(wheel_of(Path(posixpath.basename(path)), node.sha256))
            except Exception:  # packaging's InvalidWheelFilename: not a wheel's name
                continue
            bundled[(canonical(wheel.name), wheel.version)] = wheel
    found: list[Wheel] = []
    missing: list[str] = []
    for path, node in sorted(files.nodes.items()):
        directory, name = posixpath.split(path)
        site = installcheck.SITE_RE.match(directory)
        if name != "METADATA" or site is None or posixpath.dirname(directory) != site.group(0):
            continue
        headers = installcheck._headers(node.data or b"")
        key = (canonical(headers.get("Name", "")), headers.get("Version", ""))
        if key == (canonical(fixed.name), fixed.version):
            continue
        source = wheelhouse.get(key) or bundled.get(key)
        if source is None:
            missing.append(f"{headers.get('Name')} {headers.get('Version')}")
        else:
            found.append(Wheel(headers.get("Name", source.name), key[1], source.filename, source.sha256))
    if missing:
        return (), f"{', '.join(missing)} installed from no wheel carry holds (wheelhouse, base's bundled wheels)"
    return tuple(found), ""

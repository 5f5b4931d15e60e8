"""No package registry's host is written anywhere in the repository: the hosts are read at run time from pip's and
apt's own configuration (and pip's built-in default index), and `git grep` must find none of them in a tracked
file. Packages go by name, version and sha256 through the user's own index settings."""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

from helpers import ROOT

PIP_URL_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host")


def pip_hosts() -> set[str]:
    """pip's built-in default index and its file host, and every host in pip's configured index settings."""
    from pip._internal.models.index import PyPI

    hosts = {PyPI.netloc, PyPI.file_storage_domain}
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] in PIP_URL_KEYS:
            for item in value.strip("'\"").split():
                hosts.add(urllib.parse.urlsplit(item if "://" in item else f"//{item}").hostname or "")
    return {host for host in hosts if host}


def apt_uris() -> list[str]:
    """The URIs of apt's sources: deb822 `URIs:` fields and one-line `deb`/`deb-src` entries."""
    uris = []
    for path in glob.glob("/etc/apt/sources.list.d/*.sources"):
        for line in Path(path).read_text().splitlines():
            if line.startswith("URIs:"):
                uris += line.split(":", 1)[1].split()
    for path in ["/etc/apt/sources.list", *glob.glob("/etc/apt/sources.list.d/*.list")]:
        if Path(path).is_file():
            for line in Path(path).read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if words and words[0] in ("deb", "deb-src") and len(words) > 1:
                    uris.append(words[1])
    return uris


def apt_hosts() -> set[str]:
    return {host for host in (urllib.parse.urlsplit(uri).hostname for uri in apt_uris()) if host}


def test_no_registry_host_is_written_in_the_repository():
    from pip._internal.models.index import PyPI

    hosts = pip_hosts() | apt_hosts()
    assert PyPI.netloc in hosts and PyPI.file_storage_domain in hosts
    if Path("/etc/apt").is_dir():
        assert apt_hosts(), "this machine's apt has sources: their hosts are checked too"
    found = {}
    for host in sorted(hosts):
        result = subprocess.run(
            ["git", "grep", "-n", "-I", "-i", "-F", "-e", host], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode in (0, 1), result.stderr
        if result.returncode == 0:
            found[host] = result.stdout.splitlines()[:5]
    assert not found, f"registry hosts written in tracked files: {found}"


def test_the_base_images_take_the_mirror_from_apt():
    """.ci/base-images.sh's mirror is the first Debian URI of this machine's own apt sources."""
    script = (ROOT / ".ci" / "base-images.sh").read_text()
    function = script[script.index("apt_mirror() {") : script.index("\n}\n", script.index("apt_mirror() {")) + 3]
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + function + "(apt_mirror || true) | head -n 1"],
        capture_output=True,
        text=True,
        check=True,
    )
    mirror = result.stdout.strip()
    if not apt_uris():
        assert mirror == ""
        return
    assert mirror in apt_uris() and "security" not in mirror
    assert "CARRY_CI_DEBIAN_MIRROR:-$( (apt_mirror || true) | head -n 1)" in script

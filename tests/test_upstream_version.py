"""The upstream's own version in front of `+carry.VERSION` when build.wheel_version is not set: the static
`[project] version`, else the nearest version tag on the pin (`vX.Y.Z` or `X.Y.Z`, found in a shallow mirror by
deepening it), else 0; each answer says where it came from and a tag's is remembered per pin."""

from __future__ import annotations

from carry import config as configuration
from carry.source import git as carry_git
from carry.source import upstream as carry_upstream
from carry.source import upstreamversion
from carry.util.cache import Cache
from helpers import Upstream, git, write_config

PYPROJECT = '[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "tiny"\ndynamic = ["version"]\n'


def resolve(tmp_path, upstream: Upstream, pin: str):
    config = configuration.load(write_config(tmp_path / "project", str(upstream.path), pin))
    cache = Cache(tmp_path / "cache")
    mirror = carry_upstream.ensure_base(config, cache)
    return upstreamversion.resolve(config, cache, mirror, carry_git.run(mirror, "rev-parse", f"{pin}^{{tree}}"))


def test_the_nearest_version_tag_on_the_pin_in_a_shallow_mirror(tmp_path, monkeypatch):
    monkeypatch.delenv(upstreamversion.ENV, raising=False)
    upstream = Upstream.create(tmp_path / "upstream", {"pyproject.toml": PYPROJECT})
    git(upstream.path, "tag", "-a", "-m", "old", "v0.9.0")
    upstream.commit("release", {"CHANGES": "1.2.0\n"})
    git(upstream.path, "tag", "-a", "-m", "release", "v1.2.0")
    git(upstream.path, "tag", "not-a-version")
    upstream.commit("work 1", {"CHANGES": "1.2.0\nwork\n"})
    pin = upstream.commit("work 2", {"CHANGES": "1.2.0\nmore work\n"})
    found = resolve(tmp_path, upstream, pin)
    assert found == upstreamversion.UpstreamVersion(
        "1.2.0", "the nearest version tag on the pin, v1.2.0, 2 commit(s) before the pin"
    )
    assert found.template() == "1.2.0+carry.{version}"
    # Remembered per pin: upstream dropping its tags later changes nothing for this pin.
    git(upstream.path, "tag", "-d", "v1.2.0")
    assert resolve(tmp_path, upstream, pin) == found


def test_a_tag_at_the_pin_the_static_version_and_none(tmp_path, monkeypatch):
    monkeypatch.delenv(upstreamversion.ENV, raising=False)
    upstream = Upstream.create(tmp_path / "upstream", {"pyproject.toml": PYPROJECT})
    bare = resolve(tmp_path / "none", upstream, upstream.head())
    assert bare.version == "0" and bare.source.endswith("no version tag on the pin; set build.wheel_version")
    git(upstream.path, "tag", "1.6.0")  # pluggy's form: no `v`, lightweight
    assert resolve(tmp_path / "tag", upstream, upstream.head()).source == (
        "the nearest version tag on the pin, 1.6.0, at the pin"
    )
    static = upstream.commit(
        "static", {"pyproject.toml": PYPROJECT.replace('dynamic = ["version"]', 'version = "2.0.1"')}
    )
    assert resolve(tmp_path / "static", upstream, static) == upstreamversion.UpstreamVersion(
        "2.0.1", "the static [project] version in pyproject.toml"
    )
    monkeypatch.setenv(upstreamversion.ENV, "1.5.0")  # the image build hands the host's answer to its build stage
    assert resolve(tmp_path / "given", upstream, static).version == "1.5.0"

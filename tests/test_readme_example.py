"""README's "Carry your own patch", run as written on a real upstream from the package index.

pluggy's 1.5.0 (metadata in setup.cfg) and 1.6.0 (`[project]`) sdists are made into a git history
(examples/pluggy/make_upstream.py); the user's patch is a real fix: `PluginManager.unregister()` of an unknown plugin
asserts, where its docstring says it returns None. The test copies README's code blocks into shell scripts and runs
them with `carry` as this checkout, substituting only README's placeholders (the upstream URL, the registry and its
login) and, as README says to where nothing can be pulled, naming local bases. One history, one image and one
registry repository serve the whole walk: bump, check, wheel, verify, test, image --push, verify IMAGE, status,
a second release (1.6.0) pinned in the same cache built into an image beside it, upstream merges the fix, status says
MERGED, drop, and the next wheel holds upstream's fix and passes the patch's test.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import dockerenv
from helpers import ROOT, git

pytestmark = [pytest.mark.slow, pytest.mark.docker]

README = ROOT / "README.md"
SUBJECT = "unregister: an unknown plugin returns None, as the docstring says"
PATCH = "0001-unregister-an-unknown-plugin-returns-None-as-the-doc.patch"
# The fix, as the user writes it in their clone: behave as the docstring says, and pluggy's own test with it.
FIX = {
    "src/pluggy/_manager.py": (
        '            name = self.get_name(plugin)\n            assert name is not None, "plugin is not registered"\n',
        "            name = self.get_name(plugin)\n            if name is None:\n                return None\n",
    ),
    "testing/test_pluginmanager.py": (
        '    with pytest.raises(AssertionError, match=r"not registered"):\n        pm.unregister(my)\n',
        "    assert pm.unregister(my) is None\n",
    ),
}
README_URL = "https://example.com/pytest-dev/pluggy.git"
README_IMAGE = "registry.example.com/you/pluggy"


def section() -> str:
    text = README.read_text()
    start = text.index("## Carry your own patch\n")
    return text[start : text.index("\n## ", start + 1)]


def blocks(language: str) -> list[str]:
    """The code blocks of README's section in `language`, as a reader copies them (list indentation removed)."""
    found = re.findall(rf"^( *)```{language}\n(.*?)^\1```", section(), re.MULTILINE | re.DOTALL)
    return [textwrap.dedent(body) for _, body in found]


def apply_fix(repo: Path) -> None:
    for name, (old, new) in FIX.items():
        path = repo / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def history() -> dict:
    """examples/pluggy/make_upstream.py's history (built from the sdists, downloaded first when missing)."""
    made = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pluggy" / "make_upstream.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)


def test_readme_blocks_are_what_this_test_runs():
    yaml_blocks, bash_blocks = blocks("yaml"), blocks("bash")
    assert len(yaml_blocks) == 1 and README_URL in yaml_blocks[0] and README_IMAGE in yaml_blocks[0]
    assert len(bash_blocks) == 4
    assert bash_blocks[-1].splitlines()[1].split()[:3] == ["carry", "drop", PATCH]


def test_readme_carry_your_own_patch_reaches_an_image_and_drops_the_merged_patch(tmp_path, history):
    docker = dockerenv.require()
    pin = history["refs"]["refs/tags/1.5.0"]
    name = f"{docker.registry}/carry-test/readme-{secrets.token_hex(3)}/pluggy"
    # The upstream (a bare copy, so that it can merge the fix) and the user's clone beside the project.
    upstream = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", history["path"], str(upstream))
    work = tmp_path / "work"
    work.mkdir()
    git(work, "clone", "-q", str(upstream), "pluggy")
    clone = work / "pluggy"
    git(clone, "checkout", "-q", "--detach", "1.5.0")
    apply_fix(clone)
    git(clone, "commit", "-q", "-am", SUBJECT)
    fix = git(clone, "rev-parse", "HEAD")
    # build.yaml as README writes it, its placeholders filled in, and the local bases README says to name here.
    (config_text,) = blocks("yaml")
    assert f"commit: {pin}" in config_text  # README pins the 1.5.0 tag of this very history
    project = work / "project"
    project.mkdir()
    (project / "build.yaml").write_text(
        config_text.replace(README_URL, str(upstream)).replace(README_IMAGE, name)
        + f"  base_image: {docker.build_base}\n  runtime_image: {docker.runtime_base}\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "carry").write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m carry "$@"\n')
    (bin_dir / "carry").chmod(0o755)
    # No login but the one README's steps make (carry's own, in a private DOCKER_CONFIG): a Docker config of the
    # test's, with a config.json that holds none. Without that file docker-py (carry's credentials) falls back to
    # ~/.docker/config.json, and a login the machine holds there would let `verify IMAGE` read the registry.
    docker_config = tmp_path / "docker-config"
    docker_config.mkdir()
    (docker_config / "config.json").write_text('{"auths": {}}\n')
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CARRY_CACHE": str(tmp_path / "cache"),
        "DOCKER_CONFIG": str(docker_config),
    }
    for variable in ("CARRY_REGISTRY_USER", "CARRY_REGISTRY_PASSWORD"):
        env.pop(variable, None)

    def script(*parts: str):
        body = "\n".join(parts)
        body = body.replace(README_IMAGE, name).replace(
            "CARRY_REGISTRY_USER=you", f"CARRY_REGISTRY_USER={docker.registry_user}"
        )
        body = body.replace("~/.registry-password", str(docker.password_file))
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", f"cd {project}\n{body}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
            stdin=subprocess.DEVNULL,
        )

    def carry(*args: str):
        return subprocess.run(
            ["carry", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )

    *ship, follow = blocks("bash")
    try:
        shipped = script(*ship)
        assert shipped.returncode == 0, shipped.stdout[-3000:] + shipped.stderr[-6000:]
        first = (project / "VERSION").read_text().strip()
        wheel = project / "dist" / f"pluggy-1.5.0+carry.{first}-py3-none-any.whl"
        assert wheel.is_file(), sorted(os.listdir(project / "dist"))
        err = shipped.stderr
        assert "version: upstream 1.5.0 (the nearest version tag on the pin, 1.5.0, at the pin)" in err
        assert "PASS  python -c \"import pluggy; assert pluggy.PluginManager('x').unregister(object()) is None\"" in (
            shipped.stdout
        )
        # pluggy 1.5.0 names itself in setup.cfg only: the image's label comes from the wheel its build stage made.
        assert f"wheel: pluggy-1.5.0+carry.{first}-py3-none-any.whl: io.carry.wheel=pluggy" in err
        assert len(re.findall(r"^  verified$", shipped.stdout, re.MULTILINE)) == 2, shipped.stdout  # wheel, image
        ref = f"{name}:{first}"
        assert f"{ref}  sha256:" in shipped.stdout
        tree_before = json.loads(
            zipfile.ZipFile(wheel).read(f"pluggy-1.5.0+carry.{first}.dist-info/carry-buildinfo.json")
        )["tree"]

        # README's config as written (no local bases): a Python-only image builds FROM Python's own images, which
        # cannot be pulled here, and that is said in one line; without --hermetic the build stage's pip cannot reach
        # the index here, and that names --hermetic.
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        as_written = project / "as-written.yaml"
        as_written.write_text((project / "build.yaml").read_text().split("  base_image:")[0])
        unpulled = carry("--config", str(as_written), "image", "--hermetic")
        as_written.unlink()
        assert unpulled.returncode == 1 and "Traceback" not in unpulled.stderr, unpulled.stderr[-3000:]
        assert (
            f"failed (exit 1): a base image could not be pulled (BASE_IMAGE=python:{python}, "
            f"RUNTIME_IMAGE=python:{python}-slim); pull it first, or set image.base_image and image.runtime_image"
        ) in unpulled.stderr, unpulled.stderr[-3000:]
        offline = carry("image")
        if offline.returncode == 0:  # a machine whose build stage reaches the index builds; this one cannot
            assert f"{name}:{first}" in offline.stdout
        else:
            assert "pip in the build stage could not reach the package index; build with --hermetic" in (
                offline.stderr
            ), offline.stderr[-3000:]

        # Without a login, verify cannot read the registry: bad input naming the login, though the image is local.
        no_login = json.loads((docker_config / "config.json").read_text())
        assert not any(no_login.get(key) for key in ("auths", "credsStore", "credHelpers")), no_login
        anonymous = carry("verify", ref)
        assert anonymous.returncode == 2, anonymous.stdout + anonymous.stderr
        assert len(anonymous.stderr.strip().splitlines()) == 1 and "Traceback" not in anonymous.stderr
        assert "set CARRY_REGISTRY_USER and CARRY_REGISTRY_PASSWORD" in anonymous.stderr

        # Not merged yet: main (1.6.0) still asserts, and pluggy's own test there no longer has the patch's context.
        needed = json.loads(carry("status", "--json").stdout)["refs"][0]["patches"][0]
        assert (needed["name"], needed["verdict"], needed["droppable"]) == (PATCH, "CONFLICT", False)

        # A second release pinned in the same cache (two releases carried, or two CI branches): a project of the same
        # upstream URL pinned at 1.6.0. The mirror has 1.6.0 already (status fetched main) and its last pin is 1.5.0:
        # the bundle carried into the build stage must hold 1.6.0 all the same.
        release = work / "release-1.6"
        (release / "patches").mkdir(parents=True)
        (release / "VERSION").write_text("20261201.9\n")
        pin_16 = history["refs"]["refs/tags/1.6.0"]
        (release / "build.yaml").write_text((project / "build.yaml").read_text().replace(pin, pin_16))
        beside = subprocess.run(
            ["carry", "image", "--hermetic"], cwd=release, env=env, capture_output=True, text=True, timeout=600
        )
        assert beside.returncode == 0, beside.stderr[-3000:]
        bundle = tmp_path / "cache" / "bundles" / f"{pin_16}.bundle"
        assert git(tmp_path, "bundle", "list-heads", str(bundle)).split() == [pin_16, f"refs/carry/bundle/{pin_16}"]
        labels = dockerenv.docker_client().images.get(f"{name}:20261201.9").labels
        assert labels["io.carry.upstream.commit"] == pin_16 and labels["io.carry.patches"] == ""
        # Upstream merges the fix on main, after 1.6.0.
        git(clone, "checkout", "-q", "main")
        git(clone, "cherry-pick", fix)
        merged = git(clone, "rev-parse", "HEAD")
        git(clone, "push", "-q", "origin", "HEAD:main")

        followed = script(follow)
        assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-6000:]
        assert re.search(
            rf"{re.escape(PATCH)}\s+MERGED-(EXACT|MODIFIED)\s+decided by \S+\s+upstream {merged[:12]}", followed.stdout
        )
        second = (project / "VERSION").read_text().strip()
        assert second != first
        assert f"commit: {merged}" in (project / "build.yaml").read_text()
        assert (
            f"; upstream commit {merged}; pin {merged}; VERSION {second}"
            in (project / "patches" / "DROPPED.md").read_text()
        )
        fixed = project / "dist" / f"pluggy-1.6.0+carry.{second}-py3-none-any.whl"
        assert "version: upstream 1.6.0 (the nearest version tag on the pin, 1.6.0, 1 commit(s) before the pin)" in (
            followed.stderr
        )
        with zipfile.ZipFile(fixed) as archive:
            assert (
                "            if name is None:\n                return None\n"
                in archive.read("pluggy/_manager.py").decode()
            )
        assert f"report dist/{fixed.name}.test.json" in followed.stdout and "PASS  python -c" in followed.stdout

        # VERSION put back by hand: a second, different wheel under it is refused, naming both.
        (project / "VERSION").write_text(f"{first}\n")
        tree_after = json.loads(carry("check", "--json").stdout)["tree"]
        twice = carry("wheel")
        assert twice.returncode == 2 and twice.stdout == ""
        assert twice.stderr == (
            f"carry: error: dist/{wheel.name} holds VERSION {first} for tree {tree_before[:12]} (pin {pin[:12]}), "
            f"and this build is tree {tree_after[:12]} (pin {merged[:12]}): one VERSION names one artifact; run "
            f"`carry version bump` (or publish into another --out)\n"
        )
    finally:
        dockerenv.forget(name)

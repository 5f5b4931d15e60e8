"""derive: when a precompiled wheel may be the last PEP 517 build with the changed files replaced, and when the
upstream's build must run. A real git repository and a real wheel zip; the real vLLM case is in
tests/test_precompiled.py."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from carry.source import git
from carry.util.cache import Cache
from carry.wheelbuild import derive

INFO = "pkg-1.0.dist-info"


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class Upstream:
    """A bare repository whose trees are written from dicts of path -> (bytes, executable)."""

    def __init__(self, root: Path):
        self.repo = root / "mirror.git"
        subprocess.run(["git", "init", "-q", "--bare", str(self.repo)], check=True)

    def tree(self, files: dict[str, bytes], executable: tuple[str, ...] = ()) -> str:
        env = {"GIT_INDEX_FILE": str(self.repo / "scratch-index")}
        git.run(self.repo, "read-tree", "--empty", env=env)
        for path, data in files.items():
            blob = git.run_input(self.repo, ("hash-object", "-w", "--stdin"), data.decode())
            mode = "100755" if path in executable else "100644"
            git.run(self.repo, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        return git.write_tree(self.repo, env)


TREE = {
    "setup.py": b"from setuptools import setup\nsetup()\n",
    "pkg/__init__.py": b"",
    "pkg/a.py": b"A = 1\n",
    "pkg/tool.sh": b"#!/bin/sh\necho tool\n",
    "tests/test_a.py": b"def test(): pass\n",
}


def base_wheel(path: Path, tree: dict[str, bytes], commit: str, version_file: bytes | None = None) -> Path:
    """A stored wheel as a PEP 517 build of `tree` leaves it: the package files as in the tree, a compiled
    member, a generated version file, a buildinfo naming what the build wrote."""
    members = {name: data for name, data in tree.items() if name.startswith("pkg/")}
    members["pkg/_C.so"] = b"\x7fELF compiled"
    members["pkg/_version.py"] = version_file or b"version = '1.0'\n"
    info = {"tree_check": {"built": [], "generated": [], "ignored": ["pkg/_version.py"]}, "commit": commit}
    members[f"{INFO}/carry-buildinfo.json"] = json.dumps(info).encode()
    members[f"{INFO}/WHEEL"] = b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            entry = zipfile.ZipInfo(name, (2026, 12, 1, 0, 0, 0))
            entry.external_attr = (0o755 if name.endswith(".sh") else 0o644) << 16
            archive.writestr(entry, data)
        rows = [f"{name},{record_hash(data)},{len(data)}" for name, data in members.items()]
        archive.writestr(f"{INFO}/RECORD", "\n".join([*rows, f"{INFO}/RECORD,,"]) + "\n")
    return path


@pytest.fixture()
def setup(tmp_path):
    upstream = Upstream(tmp_path)
    cache = Cache(tmp_path / "cache")
    tree = upstream.tree(TREE, executable=("pkg/tool.sh",))
    commit = git.tree_commit(upstream.repo, tree, None)
    base_wheel(cache.artifacts / "k0" / "pkg-1.0-cp311-cp311-linux_x86_64.whl", TREE, commit)
    derive.remember(cache, "fam", tree, "k0", commit)
    return upstream, cache, tree


def changed(upstream: Upstream, edits: dict[str, bytes | None], executable=("pkg/tool.sh",)) -> str:
    files = {**TREE, **edits}
    return upstream.tree({k: v for k, v in files.items() if v is not None}, executable)


def test_a_package_file_changed_in_place_is_replaced_and_nothing_else(setup, tmp_path):
    upstream, cache, _ = setup
    new = changed(upstream, {"pkg/a.py": b"A = 2  # the series\n"})
    derivation = derive.plan(cache, upstream.repo, "fam", new, ())
    assert derivation.possible and derivation.replaced == {"pkg/a.py": b"A = 2  # the series\n"}
    assert "1 member(s) replaced (pkg/a.py)" in derivation.line()
    (tmp_path / "out").mkdir()
    wheel = derive.write(derivation, tmp_path / "out")
    base = zipfile.ZipFile(derivation.base.wheel)
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("pkg/a.py") == b"A = 2  # the series\n"
        assert f"{INFO}/carry-buildinfo.json" not in archive.namelist()  # the finish stamps a new one
        names = [n for n in base.namelist() if not n.endswith("carry-buildinfo.json")]
        assert archive.namelist() == names, "every member in its place"
        for name in names[:-1]:
            if name != "pkg/a.py":
                assert archive.getinfo(name).compress_size == base.getinfo(name).compress_size
                assert archive.read(name) == base.read(name)
        assert archive.getinfo("pkg/tool.sh").external_attr == base.getinfo("pkg/tool.sh").external_attr
        rows = dict(line.split(",", 1) for line in archive.read(f"{INFO}/RECORD").decode().splitlines())
        new = b"A = 2  # the series\n"
        assert rows["pkg/a.py"] == f"{record_hash(new)},{len(new)}"


def test_the_same_tree_again_derives_with_nothing_replaced(setup):
    upstream, cache, tree = setup
    derivation = derive.plan(cache, upstream.repo, "fam", tree, ())
    assert derivation.possible and derivation.replaced == {}


@pytest.mark.parametrize(
    "edits, executable, reason",
    [
        ({"pkg/b.txt": b"data\n"}, ("pkg/tool.sh",), "pkg/b.txt added (only a Python module added or removed"),
        ({"pkg/tool.sh": None}, (), "pkg/tool.sh removed (only a Python module"),
        ({"pkg/sub/m.py": b"M = 1\n"}, ("pkg/tool.sh",), "pkg/sub/m.py added, in a directory the base tree does not"),
        ({"tests/test_b.py": b"def test(): pass\n"}, ("pkg/tool.sh",), "tests/test_b.py added, in a directory whose"),
        ({"tests/test_a.py": None}, ("pkg/tool.sh",), "tests/test_a.py removed, in a directory whose modules"),
        ({"pkg/_version.py": b"v = 2\n"}, ("pkg/tool.sh",), "pkg/_version.py added, and the build writes it"),
        ({"setup.py": b"setup(name='x')\n"}, ("pkg/tool.sh",), "setup.py changed, and the wheel does not carry it"),
        ({"tests/test_a.py": b"x = 1\n"}, ("pkg/tool.sh",), "tests/test_a.py changed, and the wheel does not"),
        ({}, (), "pkg/tool.sh changed mode (100755 -> 100644)"),
    ],
)
def test_anything_but_a_carried_file_changed_in_place_runs_the_build(setup, edits, executable, reason):
    upstream, cache, _ = setup
    derivation = derive.plan(cache, upstream.repo, "fam", changed(upstream, edits, executable), ())
    assert not derivation.possible and reason in derivation.reason, derivation.reason
    assert derivation.line().endswith("; the upstream's build runs")


def test_a_module_added_removed_or_renamed_in_a_shipped_package_derives(setup, tmp_path):
    """A .py file added where the wheel ships its package is added, one the wheel carries removed, a rename is both;
    the wheel then holds every module of those packages, as the upstream's build would ship them."""
    upstream, cache, _ = setup
    cases = {
        "added": ({"pkg/b.py": b"B = 1\n"}, {"pkg/b.py": b"B = 1\n"}),
        "removed": ({"pkg/a.py": None}, {"pkg/a.py": None}),
        "renamed": ({"pkg/a.py": None, "pkg/c.py": b"A = 1\n"}, {"pkg/a.py": None, "pkg/c.py": b"A = 1\n"}),
    }
    for name, (edits, replaced) in cases.items():
        derivation = derive.plan(cache, upstream.repo, "fam", changed(upstream, edits), ())
        assert derivation.possible and derivation.replaced == replaced, (name, derivation.reason)
        out = tmp_path / name
        out.mkdir()
        with zipfile.ZipFile(derive.write(derivation, out)) as archive:
            names = set(archive.namelist())
            rows = dict(line.split(",", 1) for line in archive.read(f"{INFO}/RECORD").decode().splitlines())
        for path, data in replaced.items():
            assert (path in names) == (data is not None) and (path in rows) == (data is not None), (name, path)
            if data is not None:
                assert rows[path] == f"{record_hash(data)},{len(data)}"
        assert {"pkg/__init__.py", "pkg/_C.so"} <= names


def test_a_module_the_wheel_lacks_in_a_changed_package_runs_the_build(tmp_path):
    """A package the base wheel ships only in part (a module the build left out): adding a module there cannot
    say what the build would ship, so the build runs, naming the module the wheel lacks."""
    upstream = Upstream(tmp_path)
    cache = Cache(tmp_path / "cache")
    tree = upstream.tree({**TREE, "pkg/left_out.py": b"X = 1\n"}, executable=("pkg/tool.sh",))
    commit = git.tree_commit(upstream.repo, tree, None)
    base_wheel(cache.artifacts / "k0" / "pkg-1.0-cp311-cp311-linux_x86_64.whl", TREE, commit)
    derive.remember(cache, "fam", tree, "k0", commit)
    new = upstream.tree({**TREE, "pkg/left_out.py": b"X = 1\n", "pkg/b.py": b"B = 1\n"}, ("pkg/tool.sh",))
    derivation = derive.plan(cache, upstream.repo, "fam", new, ())
    assert not derivation.possible
    assert "pkg/left_out.py is in a package the wheel ships, but not in the wheel" in derivation.reason


def test_a_file_the_build_writes_is_never_replaced(setup):
    upstream, cache, _ = setup
    new = changed(upstream, {"pkg/a.py": b"A = 3\n"})
    derivation = derive.plan(cache, upstream.repo, "fam", new, ("pkg/a*.py",))
    assert not derivation.possible and "the build writes it (build.generated)" in derivation.reason


def test_a_generated_file_naming_the_base_commit_runs_the_build(setup):
    upstream, cache, tree = setup
    commit = git.tree_commit(upstream.repo, tree, None)
    wheel = cache.artifacts / "k0" / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    base_wheel(wheel, TREE, commit, f"version = '1.0+g{commit[:9]}'\n".encode())
    derivation = derive.plan(cache, upstream.repo, "fam", changed(upstream, {"pkg/a.py": b"A = 4\n"}), ())
    assert not derivation.possible and "pkg/_version.py, which the build writes, names the commit" in derivation.reason


def test_no_base_or_a_pruned_one_runs_the_build(setup):
    upstream, cache, tree = setup
    assert "no earlier build" in derive.plan(cache, upstream.repo, "other-family", tree, ()).reason
    for wheel in (cache.artifacts / "k0").glob("*.whl"):
        wheel.unlink()  # `cache prune` took the base's wheel
    assert "no earlier build" in derive.plan(cache, upstream.repo, "fam", tree, ()).reason


def test_an_unreadable_base_wheel_runs_the_build(setup):
    """A base wheel that is not whole is noticed before it is read (stored without a sha256, as this one is: held to
    its own RECORD), removed, and the build runs."""
    upstream, cache, tree = setup
    (wheel,) = (cache.artifacts / "k0").glob("*.whl")
    wheel.write_bytes(b"not a zip")
    derivation = derive.plan(cache, upstream.repo, "fam", tree, ())
    assert not derivation.possible and derivation.reason == (
        f"the earlier build's wheel {wheel}: no sha256 recorded beside it (an older carry's entry), and its own RECORD "
        f"does not hold: a corrupt cache entry, removed"
    )
    assert not wheel.parent.exists()


# -- another VERSION: the same plan but for the wheel's version (its lineage) ---------------------------------------

OLD, NEW = "1.0+carry.20261201.1", "1.0+carry.20261201.2"
VERSIONED = f"pkg-{OLD}.dist-info"


def versioned_base(cache: Cache, tree: str, commit: str, version_file: bytes) -> Path:
    """A stored PEP 517 build of VERSION 20261201.1, remembered for its family and its lineage."""
    members = {name: data for name, data in TREE.items() if name.startswith("pkg/")}
    members["pkg/_version.py"] = version_file
    info = {
        "tree_check": {"built": [], "generated": [], "ignored": ["pkg/_version.py"]},
        "version": "20261201.1",
        "wheel_version": OLD,
    }
    members[f"{VERSIONED}/carry-buildinfo.json"] = json.dumps(info).encode()
    members[f"{VERSIONED}/METADATA"] = f"Metadata-Version: 2.1\nName: pkg\nVersion: {OLD}\n\nAbout pkg.\n".encode()
    members[f"{VERSIONED}/WHEEL"] = b"Wheel-Version: 1.0\nTag: py3-none-any\n"
    path = cache.artifacts / "k1" / f"pkg-{OLD}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            entry = zipfile.ZipInfo(name, (2026, 12, 1, 0, 0, 0))
            entry.external_attr = (0o755 if name.endswith(".sh") else 0o644) << 16
            archive.writestr(entry, data)
        rows = [f"{name},{record_hash(data)},{len(data)}" for name, data in members.items()]
        archive.writestr(f"{VERSIONED}/RECORD", "\n".join([*rows, f"{VERSIONED}/RECORD,,"]) + "\n")
    derive.remember(cache, "fam-v1", tree, "k1", commit, "line")
    return path


def test_another_version_derives_with_the_dist_info_and_the_written_version_rewritten(tmp_path):
    upstream = Upstream(tmp_path)
    cache = Cache(tmp_path / "cache")
    tree = upstream.tree(TREE, executable=("pkg/tool.sh",))
    version_file = f"__version__ = '{OLD}'\n__version_tuple__ = (1, 0, 'carry.20261201.1')\n".encode()
    versioned_base(cache, tree, git.tree_commit(upstream.repo, tree, None), version_file)
    new = changed(upstream, {"pkg/a.py": b"A = 2\n"})
    derivation = derive.plan(cache, upstream.repo, "fam-v2", new, (), ("line", "20261201.2"))
    assert derivation.possible, derivation.reason
    assert f"version {OLD} -> {NEW}" in derivation.line() and "1 member(s) replaced (pkg/a.py)" in derivation.line()
    (tmp_path / "out").mkdir()
    wheel = derive.write(derivation, tmp_path / "out")
    assert wheel.name == f"pkg-{NEW}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert f"pkg-{NEW}.dist-info/RECORD" in names and not any(VERSIONED in n for n in names)
        assert archive.read("pkg/_version.py") == version_file.replace(b"20261201.1", b"20261201.2")
        assert f"Version: {NEW}\n" in archive.read(f"pkg-{NEW}.dist-info/METADATA").decode()
        assert archive.read("pkg/a.py") == b"A = 2\n"
        assert f"pkg-{NEW}.dist-info/carry-buildinfo.json" not in names  # the finish stamps a new one
        rows = dict(line.split(",", 1) for line in archive.read(f"pkg-{NEW}.dist-info/RECORD").decode().splitlines())
        assert rows["pkg/_version.py"].startswith(record_hash(archive.read("pkg/_version.py")))


def test_a_written_file_naming_the_old_version_otherwise_runs_the_build(tmp_path):
    upstream = Upstream(tmp_path)
    cache = Cache(tmp_path / "cache")
    tree = upstream.tree(TREE, executable=("pkg/tool.sh",))
    version_file = f"__version__ = '{OLD}'\n__version_tuple__ = (1, 0, 'carry', 20261201, 1)\n".encode()
    versioned_base(cache, tree, git.tree_commit(upstream.repo, tree, None), version_file)
    derivation = derive.plan(cache, upstream.repo, "fam-v2", tree, (), ("line", "20261201.2"))
    assert not derivation.possible
    assert "pkg/_version.py, which the build writes, names VERSION 20261201.1 in a form" in derivation.reason


def test_another_lineage_does_not_derive(tmp_path):
    upstream = Upstream(tmp_path)
    cache = Cache(tmp_path / "cache")
    tree = upstream.tree(TREE, executable=("pkg/tool.sh",))
    versioned_base(cache, tree, git.tree_commit(upstream.repo, tree, None), b"v = 1\n")
    derivation = derive.plan(cache, upstream.repo, "fam-v2", tree, (), ("other", "20261201.2"))
    assert not derivation.possible and "no earlier build" in derivation.reason
    offered = derive.plan(
        cache, upstream.repo, "fam-v2", tree, (), ("other", "20261201.2"), lambda: (None, "nothing in the registry")
    )
    assert offered.reason == "nothing in the registry"

"""The benchmark's pieces do what they claim: generated upstreams, the recording nvcc, CPU accounting, the table.

Nothing here is timed; the expensive parts (nvcc compiles, vLLM-size trees) are run small.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, carry

sys.path.insert(0, str(ROOT / "bench"))

import cudahome  # noqa: E402
import diskwatch  # noqa: E402
import gitrepo  # noqa: E402
import measure  # noqa: E402
import redisd  # noqa: E402
import run as bench  # noqa: E402
import scale  # noqa: E402
import trees  # noqa: E402


def changed_paths(repo: Path, old: str, new: str) -> set[str]:
    return set(gitrepo.git(repo, "diff-tree", "-r", "--name-only", old, new).split())


def tree_files(repo: Path, commit: str) -> list[str]:
    return gitrepo.git(repo, "ls-tree", "-r", "--name-only", commit).split("\n")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> scale.ScaleProject:
    return scale.generate(tmp_path_factory.mktemp("scale"), units=5, variants=3, nvcc_threads=3)


def test_scale_upstream_has_n_units_a_pr_and_a_main(project):
    repo = project.upstream
    assert gitrepo.git(repo, "rev-parse", "refs/pull/1/head") == project.pin
    files = tree_files(repo, project.pin)
    assert sorted(f for f in files if f.endswith(".cu")) == [f"csrc/k{i:02d}.cu" for i in range(5)]
    assert {"setup.py", "pyproject.toml", "csrc/module.c", "scalebench/offload.py"} <= set(files)
    kernel = gitrepo.git(repo, "show", f"{project.pin}:csrc/k03.cu")
    assert "__global__ void rms_norm" in kernel and "<<<" in kernel
    base = gitrepo.git(repo, "rev-parse", f"{project.pin}~1")
    assert gitrepo.git(repo, "merge-base", "main", project.pin) == base != gitrepo.git(repo, "rev-parse", "main")
    assert 'NVCC_THREADS: "3"' in project.config.read_text()


def checked_tree(project: scale.ScaleProject, env: dict[str, str]) -> str:
    result = carry("--config", str(project.config), "check", "--json", env=env)
    assert result.code == 0, result.out + result.err
    return json.loads(result.out)["tree"]


def test_variants_change_only_what_they_claim(project, tmp_path):
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    project.use(python=0, cuda=0)
    base = checked_tree(project, env)
    project.use(python=1, cuda=0)
    python_only = checked_tree(project, env)
    project.use(python=1, cuda=2)
    one_cu = checked_tree(project, env)
    project.use(python=0, cuda=0)
    mirror = next((tmp_path / "cache" / "mirrors").glob("*.git"))
    assert changed_paths(mirror, base, python_only) == {"scalebench/offload.py"}
    assert changed_paths(mirror, python_only, one_cu) == {f"csrc/{project.patched_unit}.cu"}
    patches = sorted(p.name for p in project.patches.iterdir())
    assert patches == ["0001-ops-scale-one-kernel-unit.patch", "0002-offload-reset-before-each-real-step.patch"]


def test_history_has_the_commits_it_claims(tmp_path):
    history, tree = trees.history(tmp_path, commits=2000, tip_files=40, tip_bytes=40_000, churn_bytes=800)
    assert history.commits == 2000
    assert gitrepo.count_commits(history.repo, "refs/pull/1/head") == 2000
    assert gitrepo.count_commits(history.repo, "main") == 1997
    assert gitrepo.git(history.repo, "merge-base", "main", history.pin) == gitrepo.git(
        history.repo, "rev-parse", "main"
    )
    assert sorted(tree) == sorted(tree_files(history.repo, history.pin))
    assert history.tip_files == len(tree) and 20 <= len(tree) <= 200
    assert history.tip_bytes == sum(len(t.encode()) for t in tree.values())
    assert history.written_bytes > 1500 * 800  # every commit wrote new text


def test_generators_are_deterministic(tmp_path):
    first, _ = trees.history(tmp_path / "a", commits=30, tip_files=20, tip_bytes=20_000, churn_bytes=500)
    again, _ = trees.history(tmp_path / "b", commits=30, tip_files=20, tip_bytes=20_000, churn_bytes=500)
    assert first.pin == again.pin
    one = scale.generate(tmp_path / "c", units=2, variants=2)
    two = scale.generate(tmp_path / "d", units=2, variants=2)
    assert (one.pin, one.cuda_variants, one.python_variants) == (two.pin, two.cuda_variants, two.python_variants)


def test_check_upstream_tree_size_and_patches_apply_in_order(tmp_path):
    upstream = trees.check_upstream(tmp_path, files=300, total_bytes=3_000_000, commits=5, churn_bytes=2000)
    repo, pin = upstream.history.repo, upstream.history.pin
    first = gitrepo.git(repo, "rev-list", "--max-parents=0", "main")
    assert len(tree_files(repo, first)) == 300
    size = sum(int(line.split()[3]) for line in gitrepo.git(repo, "ls-tree", "-r", "-l", first).split("\n"))
    assert 2_700_000 <= size <= 3_300_000
    texts = [gitrepo.git(repo, "show", f"{first}:{path}") for path in tree_files(repo, first)[:50]]
    assert all(text.isascii() and text.count("\n") >= 1 for text in texts)
    index = {"GIT_INDEX_FILE": str(tmp_path / "index")}
    gitrepo.git(repo, "read-tree", pin, env=index)
    second = upstream.patches[1]
    assert (
        subprocess.run(
            ["git", "apply", "--cached", "--check", str(second)],
            cwd=repo,
            env={**gitrepo.git_env(), **index},
            capture_output=True,
        ).returncode
        != 0
    ), "0002 needs 0001 first"
    for patch in upstream.patches:
        gitrepo.git(repo, "apply", "--cached", str(patch), env=index)


def test_recording_nvcc_logs_each_call(tmp_path):
    cuda = cudahome.make(tmp_path)
    (tmp_path / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] = 1.0f; }\n")
    nvcc = str(cuda.home / "bin" / "nvcc")
    assert subprocess.run([nvcc, "--version"], capture_output=True).returncode == 0
    done = subprocess.run([nvcc, "-E", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.i")], capture_output=True)
    assert done.returncode == 0, done.stderr
    calls = cuda.calls()
    assert [c.kind for c in calls] == ["other", "preprocess"]
    assert calls[1].source.endswith("k.cu") and calls[1].rc == 0
    assert calls[1].peak_rss > 1_000_000 and calls[1].cpu_s > 0


def test_measure_counts_child_cpu(tmp_path):
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    done = measure.run([sys.executable, "-c", busy], {})
    assert done.code == 0
    assert done.cpu_s >= 0.25
    assert done.wall_s >= 0.25 and done.machine_busy_s >= done.cpu_s * 0.9


def test_bench_redis_is_private_empty_and_demands_its_password(tmp_path):
    import shutil

    from carry.config.build import RemoteCache
    from carry.wheelbuild import compilecache

    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (.ci/services.sh installs it)", pytrace=False)
        pytest.skip("redis-server is not installed: bash .ci/services.sh")
    with redisd.started(tmp_path / "redis") as redis:
        remote = RemoteCache.parse(redis.url, "bench")
        assert (tmp_path / "redis" / "redis.conf").stat().st_mode & 0o777 == 0o600
        assert compilecache.probe(remote, compilecache.Credentials(None, redis.password)).usable
        assert "wants a password" in compilecache.probe(remote, compilecache.Credentials(None, None)).reason
    gone = compilecache.probe(remote, compilecache.Credentials(None, redis.password), timeout=1)
    assert gone.reason == "connection refused", "the bench stops its redis"


def test_bench_parts_include_the_second_runner():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--only", "nope"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "check, fetch, rebuild, runners" in done.stderr, done.stderr


def test_table_says_pass_fail_and_reports():
    rows = [
        bench.Row("a", "kept", "1 s", "<= 2 s", True),
        bench.Row("a", "missed", "3 s", "<= 2 s", False),
        bench.Row("b", "info", "x"),
    ]
    lines = bench.table(rows).splitlines()
    assert lines[2].endswith("PASS") and lines[3].endswith("FAIL") and lines[4].endswith("x")


# carry behaviour the bench's targets rest on ------------------------------------------------------------------


def test_auto_jobs_run_one_nvcc_per_core_and_export_the_thread_budget():
    from carry.wheelbuild import toolchain

    plan = toolchain.choose_jobs(None, {"MAX_JOBS": "auto", "NVCC_THREADS": "3"})
    assert plan.threads == 3 and plan.assumed_bytes_per_job == 3 * toolchain.MEMORY_PER_JOB_BYTES
    assert 1 <= plan.jobs <= toolchain.usable_cores()
    assert plan.max_jobs == plan.jobs * 3, "vLLM-style builds divide MAX_JOBS by NVCC_THREADS"
    assert toolchain.choose_jobs(None, {"MAX_JOBS": "5", "NVCC_THREADS": "3"}).max_jobs == 5
    assert toolchain.choose_jobs(4, {"NVCC_THREADS": "2"}).max_jobs == 4


def test_stamp_keeps_the_other_members_bytes(tmp_path):
    """Stamping appends the buildinfo and a new RECORD; every other member keeps its compressed bytes."""
    import os
    import zipfile

    from wheel.wheelfile import WheelFile

    from carry.binaries import buildinfo

    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    words = [os.urandom(3).hex().encode() for _ in range(300)]
    (tree / "pkg" / "_C.so").write_bytes(b" ".join(words[i * 7919 % 300] for i in range(40_000)))
    (tree / "pkg" / "__init__.py").write_text("x = 1\n")
    (tree / "pkg-1.0.dist-info").mkdir()
    (tree / "pkg-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    built = tmp_path / "built" / "pkg-1.0-py3-none-any.whl"
    built.parent.mkdir()
    with WheelFile(built, "w") as out:
        out.write_files(str(tree))
    wheel = tmp_path / built.name  # the same members deflated at level 1: a re-deflate would change their sizes
    with zipfile.ZipFile(built) as src, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        for member in src.infolist():
            dst.writestr(member.filename, src.read(member))

    def raw(path: Path) -> dict[str, tuple[int, int, int]]:
        with zipfile.ZipFile(path) as archive:
            return {m.filename: (m.header_offset, m.compress_size, m.CRC) for m in archive.infolist()}

    before = raw(wheel)
    assert buildinfo.stamp(wheel, {"format": 1}) == wheel
    after = raw(wheel)
    assert {n: v for n, v in after.items() if not n.endswith(("RECORD", buildinfo.FILENAME))} == {
        n: v for n, v in before.items() if not n.endswith("RECORD")
    }
    assert buildinfo.read(wheel) == {"format": 1}  # every RECORD hash checked while reading
    with zipfile.ZipFile(wheel) as archive:
        assert archive.namelist()[-1] == "pkg-1.0.dist-info/RECORD"
        assert archive.testzip() is None


def test_stamp_works_when_record_is_not_last_and_can_retag(tmp_path):
    import zipfile

    from carry.binaries import buildinfo

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    record = (
        "pkg/__init__.py,sha256="
        + __import__("base64")
        .urlsafe_b64encode(__import__("hashlib").sha256(b"x = 1\n").digest())
        .rstrip(b"=")
        .decode()
        + ",6\npkg-1.0.dist-info/RECORD,,\n"
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg-1.0.dist-info/RECORD", record)
        archive.writestr("pkg/__init__.py", "x = 1\n")
    assert buildinfo.stamp(wheel, {"format": 2}) == wheel
    assert buildinfo.read(wheel) == {"format": 2}
    archive_wheel = "pkg-1.0.dist-info/WHEEL"
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr(archive_wheel, "Wheel-Version: 1.0\nTag: py3-none-any\n")
    tagged = buildinfo.stamp(wheel, {"format": 3}, tags=("cp38-abi3-manylinux_2_28_x86_64",))
    assert tagged.name == "pkg-1.0-cp38-abi3-manylinux_2_28_x86_64.whl" and not wheel.exists()
    assert buildinfo.wheel_tags(tagged) == ("cp38-abi3-manylinux_2_28_x86_64",)
    assert buildinfo.read(tagged) == {"format": 3}


def test_the_vllm_part_measures_carry_as_installed_and_counts_only_carry_imports(tmp_path, monkeypatch):
    import vllmbench

    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--only", "nope"], capture_output=True, text=True
    )
    assert "vllm" in done.stderr.splitlines()[-1]
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = vllmbench.env_for(tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    # as installed: click and yaml import, and no .pth hook of this interpreter's site-packages runs (a `pip install
    # -e` finder, setuptools' distutils shim): the baseline and carry start as they would for a user
    python = measure.installed_python(tmp_path)
    probe = "import sys, click, yaml; print(sorted(m for m in sys.modules if 'editable' in m or 'distutils' in m))"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"
    out = (
        "import time: self [us] | cumulative | imported package\nimport time:      1500 |       2000 | carry.config\n"
        "import time:       900 |        900 |   yaml\nimport time:       500 |        500 |     carry.arch\n"
    )
    assert sum(int(us) for us, name in vllmbench.IMPORT_RE.findall(out) if name.strip().startswith("carry")) == 2000


def test_diskwatch_names_the_largest_fixture_dirs_under_pytests_temp_root(tmp_path):
    """.ci/run's sampler explains its peak by the largest folders three levels below pytest's temp root: a worker's
    fixture dir, a shared one, each measured on disk (a hard link once) and named once, largest first."""
    root = tmp_path / "pytest-of-ci"
    dirs = [root / "pytest-1" / "popen-gw0" / "big0", root / "pytest-1" / "shared" / "small", root / "pytest-1" / "x"]
    for folder, size in zip(dirs, (3_000_000, 100_000, 50_000)):
        (folder / "deeper").mkdir(parents=True)
        (folder / "deeper" / "f").write_bytes(b"x" * size)
    os.link(dirs[0] / "deeper" / "f", dirs[0] / "again")
    (root / "pytest-current").symlink_to(root / "pytest-1")  # as pytest makes it: counted once
    found = diskwatch.largest((root,), count=2)
    assert [path for _, path in found] == [str(dirs[0]), str(dirs[1])]
    assert 3_000_000 <= found[0][0] < 3_200_000 and found[1][0] < 200_000

"""The build environment carry owns: real uv, real PyPI, vLLM 0.33.0's real [build-system] requires.

Every env lives in one private CARRY_CACHE for the session; uv's own cache is the machine's (default location), so
the first torch env downloads about 3 GB and later ones take a second or two. Nothing here is timed beyond
sanity bounds: bench/buildenv.py measures cold, warm and reused.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from carry import config
from carry.config.build import BuildEnvironment
from carry.platforms import Platform
from carry.source import releases
from carry.util import reporter
from carry.util.errors import BadInput, Failed
from carry.wheelbuild import buildenv
from helpers import ROOT, assert_bad_input, carry, write_config

try:
    import tomllib
except ImportError:
    import tomli as tomllib

VLLM_REQUIRES = (
    "cmake>=3.26.1",
    "ninja",
    "packaging>=24.2",
    "setuptools<81.0.0,>=77.0.3",
    "setuptools-scm>=8.0",
    "setuptools-rust>=1.9.0",
    "torch==2.14.0",
    "wheel",
    "jinja2",
)
SMALL = ("packaging>=24.2",)  # a cheap env for the cases that do not need torch


def run_in(python: Path, code: str) -> str:
    done = subprocess.run(
        [str(python), "-I", "-c", code], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("carry-cache")


@pytest.fixture(scope="session")
def vllm_pyproject() -> dict:
    sdist = releases.fetch(ROOT / "examples" / "vllm" / "releases.yaml", ["vllm-0.33.0.tar.gz"])[0]
    with tarfile.open(sdist) as tar:
        return tomllib.load(tar.extractfile("vllm-0.33.0/pyproject.toml"))


@pytest.fixture(scope="session")
def vllm_spec(vllm_pyproject) -> buildenv.EnvSpec:
    return buildenv.EnvSpec.resolve(buildenv.requires_from_pyproject(vllm_pyproject))


@pytest.fixture(scope="session")
def vllm_env(vllm_spec, cache_root) -> buildenv.BuildEnv:
    return buildenv.ensure(vllm_spec, cache_root)


def envs(cache_root: Path) -> set[str]:
    return {p.name for p in (cache_root / "envs").iterdir()} if (cache_root / "envs").is_dir() else set()


# requirements and the spec -------------------------------------------------------------------------------------


def test_requires_read_from_vllms_real_pyproject(vllm_pyproject):
    assert buildenv.requires_from_pyproject(vllm_pyproject) == VLLM_REQUIRES
    assert buildenv.requires_from_pyproject({"project": {"name": "x"}}) == ("setuptools>=40.8.0",)
    with pytest.raises(BadInput, match=r"\[build-system\] requires must be a list"):
        buildenv.requires_from_pyproject({"build-system": {"build-backend": "setuptools.build_meta"}})
    with pytest.raises(BadInput, match=r"has 'torch ==', which is not a PEP 508 requirement") as bad:
        buildenv.requires_from_pyproject({"build-system": {"requires": ["wheel", "torch =="]}}, "up/pyproject.toml")
    assert "up/pyproject.toml" in str(bad.value) and "\n" not in str(bad.value)


def test_requires_of_a_tree(tmp_path):
    assert buildenv.requires_of(tmp_path) == ("setuptools>=40.8.0",)  # no pyproject.toml: PEP 518's default
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["Setuptools >= 68", "wheel"]\n')
    assert buildenv.requires_of(tmp_path) == ("setuptools>=68", "wheel")
    (tmp_path / "pyproject.toml").write_text("[build-system\n")
    with pytest.raises(BadInput, match="cannot be read as TOML"):
        buildenv.requires_of(tmp_path)


def test_key_is_what_went_in(vllm_spec, tmp_path):
    spelled = buildenv.EnvSpec.resolve(
        [
            "Jinja2",
            "torch == 2.14.0",
            "setuptools>=77.0.3 , <81.0.0",
            "wheel",
            "ninja",
            "setuptools_scm>=8.0",
            "cmake>=3.26.1",
            "packaging>=24.2",
            "setuptools-rust>=1.9.0",
        ]
    )
    assert spelled.key == vllm_spec.key  # order, case and spelling of the same requirements do not matter
    more = buildenv.EnvSpec.resolve(VLLM_REQUIRES, BuildEnvironment(requires=("six",)))
    index = buildenv.EnvSpec.resolve(
        VLLM_REQUIRES, BuildEnvironment(extra_index_urls=("https://torch.index.example/whl/cu130",))
    )
    with_password = buildenv.EnvSpec.resolve(
        VLLM_REQUIRES, BuildEnvironment(extra_index_urls=("https://carry:s3cret@torch.index.example/whl/cu130",))
    )
    (tmp_path / "python3").symlink_to(sys.executable)  # another interpreter path (asked in a subprocess)
    other_python = buildenv.EnvSpec.resolve(VLLM_REQUIRES, python=str(tmp_path / "python3"))
    assert len({vllm_spec.key, more.key, index.key, other_python.key}) == 4
    assert with_password.key == index.key  # the credential is not part of what is installed
    assert "s3cret" not in json.dumps(with_password.public())
    assert with_password.uv_environ()["UV_EXTRA_INDEX_URL"] == "https://carry:s3cret@torch.index.example/whl/cu130"
    assert other_python.python == str(tmp_path / "python3") and vllm_spec.python == sys.executable
    assert other_python.python_version == vllm_spec.python_version
    assert vllm_spec.platform is Platform.LINUX_AMD64 and vllm_spec.public()["uv"] == vllm_spec.uv.version


def test_caller_uv_and_pip_variables_do_not_reach_uv(monkeypatch, tmp_path):
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("UV_EXCLUDE_NEWER", "2019-01-01T00:00:00Z")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    spec = buildenv.EnvSpec.resolve(SMALL)
    environ = spec.uv_environ()
    assert "UV_INDEX_URL" not in environ and "UV_EXCLUDE_NEWER" not in environ and "PIP_INDEX_URL" not in environ
    assert environ["UV_CACHE_DIR"] == str(tmp_path / "uv-cache")  # where the cache is, not what is installed
    made = buildenv.ensure(spec, tmp_path / "cache")  # with either variable honoured this could not install
    assert made.versions["packaging"] in SpecifierSet(">=24.2")
    assert (tmp_path / "uv-cache").is_dir()


# the vLLM env ---------------------------------------------------------------------------------------------------


def test_vllm_env_has_cuda_torch_and_the_setuptools_vllm_asks_for(vllm_env, vllm_spec, cache_root):
    assert vllm_env.root == cache_root / "envs" / vllm_spec.key[:32] and vllm_env.key == vllm_spec.key
    assert (vllm_env.root / buildenv.MARKER).is_file()
    assert run_in(vllm_env.python, "import torch; print(torch.__version__)") == "2.14.0+cu130"
    setuptools = run_in(vllm_env.python, "import setuptools; print(setuptools.__version__)")
    assert setuptools in SpecifierSet(">=77.0.3,<81")
    prefix = run_in(vllm_env.python, "import sys; print(sys.prefix)")
    assert Path(prefix) == vllm_env.root and Path(prefix) != Path(sys.prefix)  # never carry's interpreter
    assert vllm_env.versions["torch"] == "2.14.0+cu130" and vllm_env.versions["setuptools"] == setuptools
    assert list(vllm_env.versions)[:2] == ["torch", "setuptools"]
    assert set(vllm_env.versions) == {
        "torch",
        "setuptools",
        "setuptools-scm",
        "setuptools-rust",
        "wheel",
        "packaging",
        "cmake",
        "ninja",
        "jinja2",
    }
    assert vllm_env.describe().startswith(f"env {vllm_spec.key[:8]}: torch 2.14.0+cu130, setuptools {setuptools},")
    assert f"uv {vllm_spec.uv.version}" in vllm_env.describe() and "nvidia-cudnn-cu13" in vllm_env.packages
    as_json = vllm_env.to_json()
    assert as_json["key"] == vllm_spec.key and as_json["versions"]["torch"] == "2.14.0+cu130"
    assert as_json["inputs"]["requires"] == sorted(VLLM_REQUIRES) and as_json["python"] == str(vllm_env.python)
    libtorch = next(vllm_env.root.rglob("libtorch_cpu.so"))
    assert vllm_env.copied == (libtorch.stat().st_nlink == 1)  # hardlinked from uv's cache unless it said so
    build_env = vllm_env.environ({"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere"})
    assert "PYTHONPATH" not in build_env and build_env["VIRTUAL_ENV"] == str(vllm_env.root)
    assert shutil.which("cmake", path=build_env["PATH"]) == str(vllm_env.root / "bin" / "cmake")


def test_same_spec_is_reused(vllm_env, vllm_spec, cache_root):
    marker = vllm_env.root / buildenv.MARKER
    before = marker.stat().st_mtime_ns, (vllm_env.root / "bin" / "python").lstat().st_ino
    again = buildenv.ensure(vllm_spec, cache_root)
    assert again.reused and again.root == vllm_env.root and again.versions == vllm_env.versions
    assert (marker.stat().st_mtime_ns, (again.root / "bin" / "python").lstat().st_ino) == before
    assert again.seconds < 1.0, again.seconds  # a sanity bound; bench/buildenv.py measures it
    assert "reused" in again.describe() and again.downloaded is None and again.inputs == vllm_env.inputs


def test_another_spec_is_another_env(vllm_env, vllm_spec, cache_root):
    other = buildenv.EnvSpec.resolve(
        buildenv.requires_from_pyproject({"build-system": {"requires": list(VLLM_REQUIRES)}}),
        BuildEnvironment(requires=("six",)),
    )
    made = buildenv.ensure(other, cache_root)
    assert other.key != vllm_spec.key and made.root != vllm_env.root and not made.reused
    assert made.versions["six"] and made.versions["torch"] == "2.14.0+cu130"
    assert "six" not in vllm_env.packages and {vllm_env.root.name, made.root.name} <= envs(cache_root)


def test_uv_cache_on_another_filesystem_is_said(tmp_path, monkeypatch):
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev, "needs a tmpfs apart from tmp_path"
    uv_cache = shm / f"carry-test-uv-{os.getpid()}"
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    lines = io.StringIO()
    try:
        with reporter.using(reporter.Reporter(lines)):
            made = buildenv.ensure(buildenv.EnvSpec.resolve(["six"]), tmp_path / "cache")
    finally:
        shutil.rmtree(uv_cache, ignore_errors=True)
    assert made.copied and "copied from uv's cache" in made.describe()
    assert "set UV_CACHE_DIR to a directory on the same one" in lines.getvalue()
    six = next(made.root.rglob("six.py"))
    assert six.stat().st_nlink == 1  # a copy, not a hardlink


# failures -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requirement, where",
    [
        ("torch==0.0.1", "build.environment.requires"),
        ("carry-no-such-package-zzz", "build.environment.requires"),
    ],
)
def test_unsatisfiable_requirement_is_one_line_naming_it(tmp_path, requirement, where):
    cache = tmp_path / "cache"
    spec = buildenv.EnvSpec.resolve(SMALL, BuildEnvironment(requires=(requirement,)))
    with pytest.raises(BadInput) as bad:
        buildenv.ensure(spec, cache)
    line = str(bad.value)
    assert "\n" not in line and line.startswith(f"build environment: {requirement} cannot be installed: ")
    assert "Because" in line and where in line and "packaging" not in line.split(": ", 2)[1]
    assert envs(cache) == set() and not list((cache / "logs").glob("env-*"))


def test_unsatisfiable_upstream_requirement_says_where_it_came_from(tmp_path):
    spec = buildenv.EnvSpec.resolve(["torch==0.0.1", "wheel"])
    with pytest.raises(
        BadInput,
        match=r"^build environment: torch==0\.0\.1 cannot be installed: .*"
        r"Change the upstream's \[build-system\] requires with a patch",
    ):
        buildenv.ensure(spec, tmp_path / "cache")
    assert envs(tmp_path / "cache") == set()


def test_unreachable_index_is_failed_in_one_line_without_its_password(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    spec = buildenv.EnvSpec.resolve(SMALL, BuildEnvironment(index_url="http://carry:s3cret@127.0.0.1:9/simple"))
    with pytest.raises(Failed) as failed:
        buildenv.ensure(spec, tmp_path / "cache")
    line = str(failed.value)
    assert "\n" not in line and line.startswith("build environment: uv could not reach the package index")
    assert "127.0.0.1:9" in line and "s3cret" not in line and "carry:" not in line
    log = next((tmp_path / "cache" / "logs").glob("env-*.log")).read_text()
    assert "$ uv pip install" in log and "s3cret" not in log  # argv (logged as run) and uv's output
    assert envs(tmp_path / "cache") == set()


def test_foreign_platform_is_bad_input(tmp_path):
    spec = dataclasses.replace(buildenv.EnvSpec.resolve(SMALL), platform=Platform.LINUX_ARM64)
    with pytest.raises(BadInput, match=r"linux/arm64 cannot be made on this linux/amd64 machine.*--platform"):
        buildenv.ensure(spec, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_missing_uv_names_pip_install_uv():
    code = (
        "import sys; sys.modules['uv'] = None\n"
        "from carry.wheelbuild import buildenv\nfrom carry.util.errors import BadInput\n"
        "try:\n    buildenv.EnvSpec.resolve(['wheel'])\nexcept BadInput as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("uv is not installed for ") and "-m pip install uv" in done.stdout


# a killed or concurrent run -------------------------------------------------------------------------------------


def test_dir_without_marker_is_redone(tmp_path):
    cache = tmp_path / "cache"
    spec = buildenv.EnvSpec.resolve(SMALL)
    partial = buildenv.env_dir(cache, spec)
    (partial / "bin").mkdir(parents=True)
    (partial / "bin" / "python").symlink_to(sys.executable)  # looks like a venv, but nobody finished it
    (partial / "half-written").write_text("x")
    made = buildenv.ensure(spec, cache)
    assert not made.reused and made.root == partial and not (partial / "half-written").exists()
    assert json.loads((partial / buildenv.MARKER).read_text())["key"] == spec.key
    assert run_in(made.python, "import packaging; print(packaging.__version__)") == made.versions["packaging"]


ENSURE_SCRIPT = """
import json, sys
from pathlib import Path
from carry.wheelbuild import buildenv
spec = buildenv.EnvSpec.resolve(json.loads(sys.argv[2]))
print(json.dumps(buildenv.ensure(spec, Path(sys.argv[1])).to_json()))
"""


def start_ensure(cache: Path, requires: tuple[str, ...], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", ENSURE_SCRIPT, str(cache), json.dumps(list(requires))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def test_killed_run_leaves_nothing_taken_as_complete(tmp_path):
    cache, requires = tmp_path / "cache", ("numpy",)
    spec = buildenv.EnvSpec.resolve(requires)
    root = buildenv.env_dir(cache, spec)
    # A private, empty uv cache: numpy is downloaded, so the install is still running when the kill comes.
    proc = start_ensure(cache, requires, {"UV_CACHE_DIR": str(tmp_path / "uv-cold")})
    deadline = time.monotonic() + 120
    while not (root / "bin" / "python").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.communicate()
    assert (root / "bin" / "python").exists() and not (root / buildenv.MARKER).exists()
    made = buildenv.ensure(spec, cache)
    assert not made.reused and made.root == root and (root / buildenv.MARKER).is_file()
    assert run_in(made.python, "import numpy; print(numpy.__version__)") == made.versions["numpy"]


def test_concurrent_runs_make_it_once(tmp_path):
    cache, requires = tmp_path / "cache", ("packaging>=24.2", "jinja2")
    runs = [start_ensure(cache, requires) for _ in range(2)]
    results = []
    for proc in runs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["reused"] for r in results) == [False, True]
    assert results[0]["root"] == results[1]["root"] and len(envs(cache)) == 1
    assert results[0]["packages"] == results[1]["packages"]


# build.yaml ----------------------------------------------------------------------------------------------------

BUILD = "build:\n  build_isolation: {isolation}\n  environment:\n{body}"


def config_with(tmp_path: Path, body: str, isolation: str = "false") -> Path:
    path = write_config(
        tmp_path, "https://example.invalid/up.git", "a" * 40, extra=BUILD.format(isolation=isolation, body=body)
    )
    (tmp_path / "VERSION").write_text("20260101.1\n")
    return path


def test_build_environment_config(tmp_path):
    path = config_with(
        tmp_path,
        "    requires: ['torch==2.14.0', six]\n"
        "    index_url: https://user:pw@pypi.example/simple\n"
        "    extra_index_urls: https://torch.index.example/whl/cu130\n",
    )
    environment = config.load(path).build.environment
    assert environment == BuildEnvironment(
        ("torch==2.14.0", "six"), "https://user:pw@pypi.example/simple", ("https://torch.index.example/whl/cu130",)
    )
    no_environment = config_with(tmp_path / "plain", "    {}\n")
    assert config.load(no_environment).build.environment == BuildEnvironment()


@pytest.mark.parametrize(
    "body, isolation, needles",
    [
        ("    requires: ['torch ==']\n", "false", ["build.environment.requires", "'torch =='", "PEP 508"]),
        ("    requires: {torch: 1}\n", "false", ["build.environment.requires must be a list of non-empty strings"]),
        (
            "    extra_index_urls: ['ftp://user:s3cret@host/simple']\n",
            "false",
            ["build.environment.extra_index_urls", "ftp://host/simple", "https://HOST/PATH"],
        ),
        ("    index_url: 'https://'\n", "false", ["build.environment.index_url", "https://HOST/PATH"]),
        (
            "    index_url: ['https://user:s3cret@host/simple']\n",
            "false",
            ["build.environment.index_url must be one URL"],
        ),
        (
            "    extra_index_urls: [{url: 'https://user:s3cret@host/simple'}]\n",
            "false",
            ["build.environment.extra_index_urls must be a list of URLs"],
        ),
        ("    index_url: ''\n", "false", ["build.environment.index_url has ''"]),
        ("    torch_index: x\n", "false", ["unknown key build.environment.torch_index", "requires, index_url"]),
        ("    requires: [six]\n", "true", ["build.environment is used only with build_isolation: false"]),
    ],
)
def test_bad_build_environment_is_one_line(tmp_path, body, isolation, needles):
    path = config_with(tmp_path, body, isolation)
    result = carry("--config", str(path), "version")
    assert_bad_input(result, *needles)
    assert "s3cret" not in result.err

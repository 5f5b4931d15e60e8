"""ci/gpu_offline.py, the tool that carries a pushed image to an offline GPU host (docs/gpu-testing.md, "On an
offline GPU host"), against a registry made here: it asks for a bearer token (basic credentials at its realm),
redirects blobs to a storage path that must never see the Authorization header, and drops the first download of the
big layer halfway. `pack` picks the platform from an OCI index, checks every digest, cuts the stream into 1 MiB
pieces; `unpack` applies the layers as overlayfs stacks them (whiteouts, an opaque directory, a file replacing a
directory, hardlinks, setuid, a symlink that points out of the root). `run` needs root and mounts: it ran by hand
(docs/gpu-testing.md says where); here only its refusals."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ci" / "gpu_offline.py"
USER, PASSWORD, TOKEN = "offline-user", "s3cret-offline-pw", "token-abc"
NAME = "team/offline"
BIG = os.urandom(2_500_000)  # random: gzip keeps it > 2 MiB, so the stream spans several 1 MiB pieces
MARKER = f"gpu-offline-escape-{os.getpid()}"


def tar_of(entries: list[tuple]) -> bytes:
    """A layer tar of (name, type, payload, mode): payload is bytes for a file, the target for links."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, kind, payload, mode in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, mode, 1_700_000_000
            if kind == tarfile.REGTYPE:
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
                continue
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = payload
            archive.addfile(info)
    return out.getvalue()


D, F, S, H = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
LOWER = [
    ("etc", D, None, 0o755),
    ("etc/debian_version", F, b"12\n", 0o644),
    ("etc/conf.d", D, None, 0o755),
    ("etc/conf.d/old-a", F, b"a", 0o644),
    ("etc/conf.d/sub", D, None, 0o755),
    ("etc/conf.d/sub/old-b", F, b"b", 0o644),
    ("bin", D, None, 0o755),
    ("bin/tool", F, b"#!/bin/sh\necho tool\n", 0o4755),
    ("bin/link", S, "tool", 0o777),
    ("bin/hard", H, "bin/tool", 0o4755),
    ("lib", D, None, 0o755),
    ("lib/x", F, b"x", 0o644),
    ("data", D, None, 0o755),
    ("data/big", F, BIG, 0o600),
    ("escape", S, "/", 0o777),
    ("tmp", D, None, 0o1777),
]
UPPER = [
    ("etc", D, None, 0o755),
    ("etc/.wh.debian_version", F, b"", 0o600),
    ("etc/conf.d", D, None, 0o755),
    ("etc/conf.d/.wh..wh..opq", F, b"", 0o600),
    ("etc/conf.d/new", F, b"new", 0o640),
    ("lib", F, b"now a file", 0o644),
    (f"escape/tmp/{MARKER}", F, b"inside", 0o644),
    (f"../../tmp/{MARKER}-dots", F, b"inside", 0o644),
]


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def build_image() -> tuple[dict[str, bytes], dict[str, tuple[str, bytes]], str]:
    """(blobs by digest, manifests by tag and digest, the index digest): an OCI index of linux/amd64 (a gzip layer
    and an uncompressed one) and linux/arm64, and a buildx attestation entry."""
    lower, upper = tar_of(LOWER), tar_of(UPPER)
    lower_gz = gzip.compress(lower, mtime=0)
    blobs = {sha(lower_gz): lower_gz, sha(upper): upper}
    manifests: dict[str, tuple[str, bytes]] = {}
    entries = []
    for arch in ("amd64", "arm64"):
        config = json.dumps(
            {
                "architecture": arch,
                "os": "linux",
                "config": {"Env": ["PATH=/bin", "A=1"], "Entrypoint": ["/bin/tool"], "WorkingDir": "/data"},
                "rootfs": {"type": "layers", "diff_ids": [sha(lower), sha(upper)]},
            }
        ).encode()
        blobs[sha(config)] = config
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": sha(config),
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": sha(lower_gz),
                        "size": len(lower_gz),
                    },
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha(upper), "size": len(upper)},
                ],
            }
        ).encode()
        manifests[sha(manifest)] = ("application/vnd.oci.image.manifest.v1+json", manifest)
        entries.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": sha(manifest),
                "size": len(manifest),
                "platform": {"os": "linux", "architecture": arch},
            }
        )
    entries.append({**entries[0], "platform": {"os": "unknown", "architecture": "unknown"}})
    index = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
    ).encode()
    manifests["1"] = manifests[sha(index)] = ("application/vnd.oci.image.index.v1+json", index)
    return blobs, manifests, sha(index)


class Registry(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.blobs, self.manifests, self.index_digest = build_image()
        self.host = f"127.0.0.1:{self.server_address[1]}"
        self.drops = {sha(gzip.compress(tar_of(LOWER), mtime=0))}  # dropped once, halfway
        self.storage_auth: list[str] = []


class Handler(http.server.BaseHTTPRequestHandler):
    server: Registry

    def log_message(self, *args: object) -> None:
        pass

    def send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        if path == "/token":
            basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") != f"Basic {basic}":
                return self.send(401)
            return self.send(200, json.dumps({"token": TOKEN}).encode())
        if path.startswith("/storage/"):
            self.server.storage_auth.append(self.headers.get("Authorization") or "")
            return self.storage(path.rsplit("/", 1)[1])
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            realm = f'Bearer realm="http://{self.server.host}/token",service="fake"'
            return self.send(401, b'{"errors":[]}', {"WWW-Authenticate": realm})
        if path == "/v2/":
            return self.send(200, b"{}")
        prefix = f"/v2/{NAME}/"
        if path.startswith(prefix + "manifests/"):
            found = self.server.manifests.get(path.rsplit("/", 1)[1])
            if not found:
                return self.send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            return self.send(200, found[1], {"Content-Type": found[0], "Docker-Content-Digest": sha(found[1])})
        if path.startswith(prefix + "blobs/"):
            return self.send(307, b"", {"Location": f"/storage/{path.rsplit('/', 1)[1]}"})
        return self.send(404)

    def storage(self, digest: str) -> None:
        body = self.server.blobs.get(digest)
        if body is None:
            return self.send(404)
        if digest in self.server.drops:
            self.server.drops.discard(digest)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return None
        return self.send(200, body)


@pytest.fixture
def registry():
    server = Registry()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def tool(*args: str, password: str = PASSWORD) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRY_REGISTRY_")}
    env.update(CARRY_REGISTRY_USER=USER, CARRY_REGISTRY_PASSWORD=password)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def one_line(result: subprocess.CompletedProcess, code: int, *words: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and all(word in lines[0] for word in words), lines
    return lines[0]


def test_pack_then_unpack_stacks_the_layers_as_overlayfs_does(registry, tmp_path):
    out, root = tmp_path / "pack", tmp_path / "root"
    packed = tool("pack", f"{registry.host}/{NAME}:1", "--out", str(out), "--piece-mib", "1")
    assert packed.returncode == 0, packed.stderr
    assert "broke off" in packed.stderr  # the dropped download, streamed again
    assert PASSWORD not in packed.stdout + packed.stderr
    assert registry.storage_auth and not any(registry.storage_auth)  # the credentials never left for storage
    image = json.loads((out / "image.json").read_text())
    assert image["index_digest"] == registry.index_digest and image["platform"] == "linux/amd64"
    assert len(image["pieces"]) == 3 and "3 pieces of 1 MiB" in packed.stdout
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {*image["pieces"], "image.json", "gpu_offline.py"}
    assert all(hashlib.sha256((out / name).read_bytes()).hexdigest() == digest for name, digest in sums.items())
    stream = b"".join((out / name).read_bytes() for name in image["pieces"])
    assert stream == b"".join(registry.blobs[blob["digest"]] for blob in image["blobs"])  # byte for byte

    unpacked = tool("unpack", str(out), str(root))
    assert unpacked.returncode == 0, unpacked.stderr
    assert unpacked.stdout.count("diff_id ok") == 2 and "2 whiteouts" in unpacked.stdout
    assert not (root / "etc" / "debian_version").exists()  # .wh.debian_version
    assert sorted(os.listdir(root / "etc" / "conf.d")) == ["new"]  # .wh..wh..opq: old-a and sub/ gone, new kept
    assert (root / "lib").is_file() and (root / "lib").read_bytes() == b"now a file"
    assert (root / "data" / "big").read_bytes() == BIG and (root / "data" / "big").stat().st_mode & 0o7777 == 0o600
    assert (root / "bin" / "tool").stat().st_mode & 0o7777 == 0o4755
    assert os.readlink(root / "bin" / "link") == "tool"
    assert (root / "bin" / "hard").stat().st_ino == (root / "bin" / "tool").stat().st_ino
    assert (root / "tmp" / MARKER).read_bytes() == b"inside"  # escape -> / resolved inside the root
    assert (root / "tmp" / f"{MARKER}-dots").read_bytes() == b"inside"  # ../../ stops at the root
    assert not Path(f"/tmp/{MARKER}").exists() and not Path(f"/tmp/{MARKER}-dots").exists()
    meta = json.loads((tmp_path / "root.image.json").read_text())
    assert (
        meta["config"]["config"]["Entrypoint"] == ["/bin/tool"] and meta["manifest_digest"] == image["manifest_digest"]
    )
    assert not list(tmp_path.glob(".gpu-offline-*"))  # the layers' tars are gone

    again = tool("unpack", str(out), str(root))
    one_line(again, 2, "not an empty directory")


def test_pack_picks_the_platform_asked_and_names_the_ones_there(registry, tmp_path):
    arm = tool("pack", f"{registry.host}/{NAME}:1", "--platform", "linux/arm64", "--out", str(tmp_path / "arm"))
    assert arm.returncode == 0, arm.stderr
    arm_digest = json.loads((tmp_path / "arm" / "image.json").read_text())["manifest_digest"]
    index = json.loads(registry.manifests["1"][1])
    assert arm_digest == index["manifests"][1]["digest"]
    missing = tool("pack", f"{registry.host}/{NAME}:1", "--platform", "linux/s390x", "--out", str(tmp_path / "x"))
    one_line(missing, 2, "no linux/s390x image", "linux/amd64, linux/arm64", "--platform")
    assert not (tmp_path / "x").exists()


def test_pack_refusals_are_one_line_and_never_show_the_password(registry, tmp_path):
    ref = f"{registry.host}/{NAME}:1"
    refused = tool("pack", ref, "--out", str(tmp_path / "a"), password="wrong-pw-123")
    line = one_line(refused, 2, "refused the login of", "CARRY_REGISTRY_PASSWORD")
    assert "wrong-pw-123" not in line + refused.stdout
    one_line(tool("pack", f"{registry.host}/{NAME}:nosuch", "--out", str(tmp_path / "b")), 2, "404", "tag")
    one_line(tool("pack", ref, "--out", str(tmp_path / "c"), "--piece-mib", "0"), 2, "--piece-mib")
    assert not any(tmp_path.iterdir())


def test_unpack_says_which_piece_to_copy_again(registry, tmp_path):
    out = tmp_path / "pack"
    assert tool("pack", f"{registry.host}/{NAME}:1", "--out", str(out), "--piece-mib", "1").returncode == 0
    piece = out / "piece-0001"
    data = bytearray(piece.read_bytes())
    data[100] ^= 1
    piece.write_bytes(bytes(data))
    one_line(tool("unpack", str(out), str(tmp_path / "r1")), 1, "piece-0001", "copy it again")
    piece.unlink()
    one_line(tool("unpack", str(out), str(tmp_path / "r2")), 2, "piece-0001", "missing")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_run_needs_an_unpacked_root(tmp_path):
    one_line(tool("run", str(tmp_path / "root"), "--", "true"), 2, "root.image.json is missing", "unpack")

#!/usr/bin/env python3
"""Carry an image pushed to a registry to an offline GPU host byte for byte, and start it there as the NVIDIA
container toolkit would (docs/gpu-testing.md, "On an offline GPU host"). Standard library only; Python 3.10+.

    gpu_offline.py pack REF [--platform linux/amd64] --out DIR [--piece-mib 60]
        here, with the registry: the index, the platform's manifest, its config and every layer blob, each checked
        against its sha256 while it streams to disk; the blobs concatenated into one stream cut into pieces
        DIR/piece-0000 ... of --piece-mib MiB; DIR/image.json (ref, manifest, config, blob digests and sizes),
        a copy of this script, and DIR/SHA256SUMS (`sha256sum -c` reads it too). Credentials come only from
        $CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD (basic, or a bearer token from the registry's challenge);
        plain HTTP only for a loopback registry.
    gpu_offline.py unpack DIR ROOT
        on the GPU host (root, no network): SHA256SUMS checked, each blob read back from the pieces and its sha256
        checked again, the layers decompressed in parallel and each diff_id (sha256 of the tar) checked against the
        config's rootfs.diff_ids, then extracted in order into ROOT (empty or new) with OCI whiteouts, modes,
        owners, symlinks and hardlinks. The image's config is written beside ROOT, as ROOT.image.json.
    gpu_offline.py run ROOT [--bind HOST:CONTAINER[:ro] ...] [--entrypoint PROG] [-- ARGS...]
        on the GPU host (root): /proc, /sys and /dev bound into ROOT (--rbind, made slaves), the host's NVIDIA
        driver libraries (libcuda.so*, libnvidia-*.so*) bound into ROOT's /usr/lib/x86_64-linux-gnu and nvidia-smi
        into /usr/bin, `ldconfig` run inside, /etc/hosts written; then the image's Entrypoint + Cmd (or PROG + ARGS,
        or Entrypoint + ARGS) run in `chroot ROOT` with only the config's Env, in its WorkingDir, as its User.
        Everything is unmounted and ROOT's files put back on exit, also when the command fails; the exit status
        is the command's.

Errors: one line on stderr naming the problem and the fix; exit 2 for bad input, 1 for a failed check.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import errno
import fnmatch
import glob
import hashlib
import http.client
import ipaddress
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

PROG = "gpu_offline"
FORMAT = "carry-gpu-offline/1"
USER_ENV = "CARRY_REGISTRY_USER"
PASSWORD_ENV = "CARRY_REGISTRY_PASSWORD"
MIB = 1 << 20
CHUNK = 1 << 20
INFLATE_MAX = 16 * MIB  # output of one zlib call: a chunk of zeros inflates a thousandfold
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
TIMEOUT_S = 300  # one read on an open connection
RETRIED = frozenset({408, 429, 500, 502, 503, 504})
BACKOFF_S = (1.0, 3.0, 9.0)  # before the 2nd, 3rd and 4th attempt
SUMS = "SHA256SUMS"
IMAGE_JSON = "image.json"
LIB_PATTERNS = ("libcuda.so*", "libcudadebugger.so*", "libnvidia-*.so*")
LIB_EXCLUDED = ("libnvidia-container*",)  # the toolkit's own libraries
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/usr/local/nvidia/lib64")
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control")
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/nvidia/bin", "/bin")
PERSISTENCED_SOCKET = "/run/nvidia-persistenced/socket"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Bad(Exception):
    """Bad input: exit 2."""


class Failed(Exception):
    """A check failed: exit 1."""


class Transient(Exception):
    """A fault a retry may cure: a dropped connection, a 408, 429 or 5xx answer."""


def say(line: str) -> None:
    print(line, flush=True)


def warn(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def human(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return f"{size:.2f} GB"


def short(digest: str) -> str:
    return digest[:19] + "…"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


# -- the registry --------------------------------------------------------------------------------------------------


def loopback(netloc: str) -> bool:
    host = urllib.parse.urlsplit(f"//{netloc}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Ref:
    """`host/name:tag` or `host/name@sha256:…` (Docker Hub when the first part is no host)."""

    text: str
    host: str
    name: str
    reference: str

    @classmethod
    def parse(cls, text: str) -> Ref:
        rest, at, digest = text.partition("@")
        head, _, tail = rest.rpartition("/")
        tag = ""
        if ":" in tail:
            tail, _, tag = tail.partition(":")
        path = f"{head}/{tail}" if head else tail
        first, slash, after = path.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            host, name = first, after
        else:
            host, name = "docker.io", path
            if "/" not in name:
                name = f"library/{name}"
        if not name or not re.fullmatch(r"[a-z0-9]+(?:[._/-]+[a-z0-9]+)*", name):
            raise Bad(f"{text!r} is not an image reference: give HOST/NAME:TAG or HOST/NAME@sha256:DIGEST")
        if at and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise Bad(
                f"{text!r}: the digest is not sha256:<64 hex digits>; give the image's digest as the registry names it"
            )
        return cls(text, host, name, digest if at else (tag or "latest"))


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a blob's redirect to its storage (the Authorization header stays behind: it is unredirected), never
    to plain HTTP off this machine."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        split = urllib.parse.urlsplit(newurl)
        if split.scheme != "https" and not (split.scheme == "http" and loopback(split.netloc)):
            raise Failed(f"the registry redirected to {split.scheme}://{split.netloc}: refused (not HTTPS)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class Registry:
    """GETs on one repository of the registry's /v2/ API: a 401's challenge answered (basic, or a bearer token from
    its realm) with the credentials of $CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD, never printed."""

    def __init__(self, ref: Ref):
        self.ref = ref
        self.api = "registry-1.docker.io" if ref.host == "docker.io" else ref.host
        self.scheme = "http" if loopback(self.api) else "https"
        self.user = os.environ.get(USER_ENV) or None
        self.password = os.environ.get(PASSWORD_ENV) or None
        self.authorization: str | None = None
        self.opener = urllib.request.build_opener(_Redirects())

    def probe(self) -> None:
        """`GET /v2/` before any work: an unreachable registry, or one that refuses the login, is bad input."""
        try:
            self._get("/v2/", None).close()
        except Transient as fault:
            raise Bad(f"cannot reach registry {self.api} ({fault}): check the registry in {self.ref.text}") from None

    def get(self, path: str, accept: str | None = None) -> http.client.HTTPResponse:
        """An open response to GET path (the caller reads and closes it); transient faults retried."""
        started = time.monotonic()
        for attempt in range(len(BACKOFF_S) + 1):
            try:
                return self._get(path, accept)
            except Transient as fault:
                if attempt == len(BACKOFF_S):
                    raise Failed(
                        f"registry {self.api}: GET {path} {fault} ({attempt + 1} attempts over "
                        f"{time.monotonic() - started:.0f} s): run it again once the registry answers"
                    ) from None
                warn(f"registry {self.api}: GET {path} {fault}; again in {BACKOFF_S[attempt]:.0f} s")
                time.sleep(BACKOFF_S[attempt])
        raise AssertionError("unreachable")

    def _get(self, path: str, accept: str | None) -> http.client.HTTPResponse:
        url = f"{self.scheme}://{self.api}{path}"
        for challenged in (False, True):
            request = urllib.request.Request(url)
            if accept:
                request.add_header("Accept", accept)
            if self.authorization:
                request.add_unredirected_header("Authorization", self.authorization)
            try:
                return self.opener.open(request, timeout=TIMEOUT_S)
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "")
                body = exc.read(2000)
                exc.close()
                if exc.code == 401 and not challenged and self._answer(challenge):
                    continue
                raise self._refusal(exc.code, path, body) from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                raise Transient(_reason(exc)) from None
        raise self._refusal(401, path, b"")

    def _refusal(self, code: int, path: str, body: bytes) -> Exception:
        if code in (401, 403):
            if self.user:
                return Bad(
                    f"registry {self.api} refused the login of {self.user} ({code}) for GET {path}: check "
                    f"{USER_ENV} and {PASSWORD_ENV}"
                )
            return Bad(f"registry {self.api} wants a login ({code}) for GET {path}: set {USER_ENV} and {PASSWORD_ENV}")
        if code == 404:
            return Bad(f"registry {self.api} has no {path} (404): check the image name and tag in {self.ref.text}")
        said = f"answered {code}{_registry_errors(body)}"
        return Transient(said) if code in RETRIED else Failed(f"registry {self.api}: GET {path} {said}")

    def _answer(self, challenge: str) -> bool:
        """Set the Authorization a 401's challenge asks for; False when there is none to give."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not (self.user and self.password):
                return False
            pair = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            self.authorization = f"Basic {pair}"
            return True
        if scheme.lower() != "bearer":
            return False
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.pop("realm", "")
        split = urllib.parse.urlsplit(realm)
        if split.scheme != "https" and not (split.scheme == "http" and loopback(split.netloc)):
            raise Failed(f"registry {self.api}: its token realm {realm!r} is not HTTPS; refused")
        fields.setdefault("scope", f"repository:{self.ref.name}:pull")
        request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(fields)}")
        if self.user and self.password:
            pair = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_unredirected_header("Authorization", f"Basic {pair}")
        try:
            with self.opener.open(request, timeout=60) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc.code if exc.code in (401, 403) else 502, "(token)", b"") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise Transient(f"no token from {split.netloc} ({_reason(exc)})") from None
        token = answer.get("token") or answer.get("access_token")
        if not token:
            return False
        self.authorization = f"Bearer {token}"
        return True


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else OSError(str(exc.reason))
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout):
        return "no answer (timed out)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _registry_errors(body: bytes) -> str:
    try:
        errors = json.loads(body).get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    except (ValueError, AttributeError):
        text = body[:200].decode(errors="replace")
    text = " ".join(text.split())
    return f": {text}" if text else ""


# -- pack ----------------------------------------------------------------------------------------------------------


def layer_kind(media_type: str) -> str:
    """gzip or tar; bad input for what Python's standard library cannot read (zstd) or does not know."""
    if "encrypted" in media_type:
        raise Bad(f"a layer is encrypted ({media_type}); push the image unencrypted")
    if media_type.endswith("gzip"):
        return "gzip"
    if media_type.endswith("tar"):
        return "tar"
    if "zstd" in media_type:
        raise Bad(
            f"a layer is zstd-compressed ({media_type}); Python 3.12's standard library reads gzip only: push the "
            f"image with gzip layers (buildx --output type=image,compression=gzip,force-compression=true)"
        )
    raise Bad(f"a layer has media type {media_type!r}, which unpack cannot read; push it as a gzip or tar layer")


def fetch_manifest(registry: Registry, reference: str) -> tuple[bytes, str, dict]:
    """(body, digest, document) of a manifest or index; its bytes checked against the digest asked for and the
    one the registry names."""
    with registry.get(f"/v2/{registry.ref.name}/manifests/{reference}", ACCEPT) as response:
        body = response.read()
        named = response.headers.get("Docker-Content-Digest")
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    if reference.startswith("sha256:") and digest != reference:
        raise Failed(f"registry {registry.api}: manifest {short(reference)} came back as {short(digest)}")
    if named and named.startswith("sha256:") and named != digest:
        raise Failed(
            f"registry {registry.api}: manifest {reference} names {short(named)}, its bytes are {short(digest)}"
        )
    try:
        document = json.loads(body)
    except ValueError:
        raise Failed(f"registry {registry.api}: manifest {reference} is not JSON") from None
    if not isinstance(document, dict) or document.get("schemaVersion") != 2:
        raise Bad(f"{registry.ref.text} is a schema-1 or unknown manifest; push it again with a current Docker")
    return body, digest, document


def same_platform(one: str, other: str) -> bool:
    """`os/arch[/variant]` equal; a variant only one side names matches any (arm64 is arm64/v8)."""
    (os_a, arch_a, variant_a), (os_b, arch_b, variant_b) = ((text.split("/") + ["", ""])[:3] for text in (one, other))
    if (os_a, arch_a) != (os_b, arch_b):
        return False
    return not (variant_a and variant_b) or variant_a == variant_b


def pick_platform(index: dict, platform: str, ref: str) -> dict:
    have = []
    for entry in index.get("manifests") or []:
        wanted = entry.get("platform") or {}
        if wanted.get("os") == "unknown":
            continue  # an attestation manifest (buildx provenance, SBOM)
        named = "/".join(filter(None, (wanted.get("os"), wanted.get("architecture"), wanted.get("variant"))))
        have.append(named)
        if same_platform(named, platform):
            return entry
    raise Bad(f"{ref} has no {platform} image (it has {', '.join(have) or 'none'}): pick one with --platform")


class Pieces:
    """One byte stream written into DIR/piece-NNNN files of `size` bytes each; `rewind` drops what was written
    after an offset (a blob streamed again after a fault)."""

    def __init__(self, out: str, size: int):
        self.out, self.size, self.offset = out, size, 0
        self._handle = None
        self._index = -1

    def name(self, index: int) -> str:
        return f"piece-{index:04d}"

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            index, within = divmod(self.offset, self.size)
            if index != self._index:
                self.close()
                self._handle = open(os.path.join(self.out, self.name(index)), "ab")  # noqa: SIM115 (kept open)
                self._index = index
            take = min(len(view), self.size - within)
            self._handle.write(view[:take])
            view = view[take:]
            self.offset += take

    def rewind(self, offset: int) -> None:
        self.close()
        index, within = divmod(offset, self.size)
        for later in range(index + 1, self.count() + 1):
            try:
                os.unlink(os.path.join(self.out, self.name(later)))
            except FileNotFoundError:
                pass
        path = os.path.join(self.out, self.name(index))
        if os.path.exists(path):
            if within:
                os.truncate(path, within)
            else:
                os.unlink(path)
        self.offset = offset

    def count(self) -> int:
        return (self.offset + self.size - 1) // self.size

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle, self._index = None, -1


def stream_blob(registry: Registry, blob: dict, pieces: Pieces) -> float:
    """Stream one blob into the pieces, its sha256 and size checked; again from its start after a dropped
    connection. The seconds it took."""
    digest, size = blob["digest"], blob["size"]
    start = pieces.offset
    started = time.monotonic()
    for attempt in range(len(BACKOFF_S) + 1):
        hasher, got = hashlib.sha256(), 0
        try:
            with registry.get(f"/v2/{registry.ref.name}/blobs/{digest}") as response:
                while block := response.read(CHUNK):
                    hasher.update(block)
                    pieces.write(block)
                    got += len(block)
            if got < size:  # the connection closed early (http.client returns what came)
                raise http.client.IncompleteRead(b"", size - got)
        except (OSError, http.client.HTTPException) as exc:
            pieces.rewind(start)
            if attempt == len(BACKOFF_S):
                raise Failed(f"registry {registry.api}: blob {short(digest)} broke off ({_reason(exc)})") from None
            warn(f"blob {short(digest)} broke off after {human(got)} ({_reason(exc)}); again")
            time.sleep(BACKOFF_S[attempt])
            continue
        if got != size or f"sha256:{hasher.hexdigest()}" != digest:
            pieces.rewind(start)
            raise Failed(
                f"registry {registry.api}: blob {short(digest)} came back as {got} bytes with sha256 "
                f"{hasher.hexdigest()[:12]}… (manifest: {size} bytes): the registry holds a damaged blob"
            )
        return time.monotonic() - started
    raise AssertionError("unreachable")


def resolve(registry: Registry, platform: str) -> dict:
    """The index (if any), the platform's manifest and its config: what image.json records."""
    body, digest, document = fetch_manifest(registry, registry.ref.reference)
    index_digest = None
    if "manifests" in document:
        index_digest = digest
        entry = pick_platform(document, platform, registry.ref.text)
        body, digest, document = fetch_manifest(registry, entry["digest"])
    if "layers" not in document or "config" not in document:
        raise Bad(f"{registry.ref.text}: manifest {short(digest)} has no config and layers; is it an image?")
    config_blob = document["config"]
    with registry.get(f"/v2/{registry.ref.name}/blobs/{config_blob['digest']}") as response:
        config_bytes = response.read()
    if f"sha256:{hashlib.sha256(config_bytes).hexdigest()}" != config_blob["digest"]:
        raise Failed(f"registry {registry.api}: config {short(config_blob['digest'])} does not match its digest")
    config = json.loads(config_bytes)
    actual = "/".join(filter(None, (config.get("os"), config.get("architecture"), config.get("variant"))))
    if index_digest is None and not same_platform(actual, platform):
        raise Bad(f"{registry.ref.text} is one {actual} image, not {platform}: pass --platform {actual}")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(document["layers"]):
        raise Failed(
            f"{registry.ref.text}: {len(document['layers'])} layers but {len(diff_ids)} diff_ids in its config"
        )
    blobs = [{"role": "config", "digest": config_blob["digest"], "size": len(config_bytes)}]
    for layer, diff_id in zip(document["layers"], diff_ids):
        kind = layer_kind(layer.get("mediaType", ""))
        blobs.append(
            {"role": "layer", "digest": layer["digest"], "size": layer["size"], "kind": kind, "diff_id": diff_id}
        )
    return {
        "format": FORMAT,
        "ref": registry.ref.text,
        "platform": actual,
        "index_digest": index_digest,
        "manifest_digest": digest,
        "manifest": body.decode(),
        "config_digest": config_blob["digest"],
        "config": config,
        "blobs": blobs,
    }


def pack(args: argparse.Namespace) -> int:
    ref = Ref.parse(args.ref)
    if args.piece_mib < 1:
        raise Bad(f"--piece-mib {args.piece_mib}: give at least 1")
    out = os.path.abspath(args.out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise Bad(f"{out} exists and is not an empty directory: give --out a new or empty directory")
    made = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    try:
        return _pack(ref, args.platform, out, args.piece_mib * MIB)
    except BaseException:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for name in os.listdir(out):
                os.unlink(os.path.join(out, name))
        raise


def _pack(ref: Ref, platform: str, out: str, piece_bytes: int) -> int:
    started = time.monotonic()
    registry = Registry(ref)
    registry.probe()
    image = resolve(registry, platform)
    blobs = image["blobs"]
    total = sum(blob["size"] for blob in blobs)
    say(
        f"pack: {ref.text} {image['platform']}: manifest {short(image['manifest_digest'])}"
        + (f" (index {short(image['index_digest'])})" if image["index_digest"] else " (no index)")
        + f", {len(blobs) - 1} layers, {human(total)}"
    )
    pieces = Pieces(out, piece_bytes)
    try:
        for number, blob in enumerate(blobs):
            seconds = stream_blob(registry, blob, pieces)
            what = "config" if blob["role"] == "config" else f"layer {number}/{len(blobs) - 1}"
            say(f"  {what:<12} {blob['digest']}  {human(blob['size']):>10}  sha256 ok  {seconds:.1f} s")
    finally:
        pieces.close()
    names = [pieces.name(index) for index in range(pieces.count())]
    image.update(total_bytes=total, piece_bytes=piece_bytes, pieces=names)
    with open(os.path.join(out, IMAGE_JSON), "w") as handle:
        json.dump(image, handle, indent=1)
        handle.write("\n")
    shutil.copy(os.path.abspath(__file__), os.path.join(out, "gpu_offline.py"))
    listed = [*names, IMAGE_JSON, "gpu_offline.py"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        sums = list(pool.map(sha256_file, [os.path.join(out, name) for name in listed]))
    with open(os.path.join(out, SUMS), "w") as handle:
        handle.writelines(f"{digest}  {name}\n" for digest, name in zip(sums, listed))
    seconds = time.monotonic() - started
    say(
        f"pack: {len(blobs) - 1} layers + config, {human(total)} ({total} bytes) in {len(names)} pieces of "
        f"{piece_bytes // MIB} MiB -> {out} ({seconds:.1f} s, {human(total / max(seconds, 1e-3))}/s)"
    )
    say(f"pack: copy {out}'s {len(listed) + 1} files, then as root there: python3 gpu_offline.py unpack DIR ROOT")
    return 0


# -- unpack --------------------------------------------------------------------------------------------------------


def read_sums(directory: str) -> dict[str, str]:
    path = os.path.join(directory, SUMS)
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        raise Bad(f"{path} is missing: give the directory `pack --out` wrote, with all its files") from None
    sums = {}
    for line in lines:
        match = re.fullmatch(r"([0-9a-f]{64}) [ *]([A-Za-z0-9._-]+)", line.strip())
        if not match:
            raise Bad(f"{path}: line {line[:80]!r} is not `SHA256  NAME`; copy the file again")
        sums[match.group(2)] = match.group(1)
    if IMAGE_JSON not in sums:
        raise Bad(f"{path} does not list {IMAGE_JSON}; copy the directory `pack --out` wrote again")
    return sums


def check_sums(directory: str, sums: dict[str, str]) -> None:
    missing = [name for name in sums if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise Bad(
            f"{len(missing)} file(s) of {SUMS} missing in {directory} ({', '.join(missing[:4])}"
            f"{', …' if len(missing) > 4 else ''}): copy them from the pack's directory"
        )
    names = sorted(sums)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        got = dict(zip(names, pool.map(sha256_file, [os.path.join(directory, name) for name in names])))
    wrong = [name for name in names if got[name] != sums[name]]
    if wrong:
        raise Failed(
            f"sha256 mismatch for {', '.join(wrong[:4])}{', …' if len(wrong) > 4 else ''} in {directory}: "
            f"copy {'them' if len(wrong) > 1 else 'it'} again"
        )


class Stream:
    """The pieces read back as the one stream pack wrote."""

    def __init__(self, directory: str, names: list[str], piece_bytes: int, total: int):
        self.paths = [os.path.join(directory, name) for name in names]
        self.piece_bytes = piece_bytes
        if len(self.paths) != -(-total // piece_bytes):
            raise Failed(f"image.json lists {len(self.paths)} pieces for {total} bytes; pack the image again")
        for number, path in enumerate(self.paths):
            want = min(piece_bytes, total - number * piece_bytes)
            if os.path.getsize(path) != want:
                raise Failed(f"{path} holds {os.path.getsize(path)} bytes, image.json says {want}: copy it again")

    def chunks(self, offset: int, size: int):
        while size > 0:
            index, within = divmod(offset, self.piece_bytes)
            with open(self.paths[index], "rb") as handle:
                handle.seek(within)
                left = min(size, self.piece_bytes - within)
                while left > 0:
                    block = handle.read(min(CHUNK, left))
                    if not block:
                        raise Failed(f"{self.paths[index]} ends early: copy it again")
                    yield block
                    left -= len(block)
                    offset += len(block)
                    size -= len(block)


class Inflater:
    """gzip members inflated one after another, each zlib call's output bounded."""

    def __init__(self) -> None:
        self.zlib = zlib.decompressobj(wbits=31)

    def feed(self, data: bytes):
        while True:
            block = self.zlib.decompress(data, INFLATE_MAX)
            if block:
                yield block
            if self.zlib.eof:
                data = self.zlib.unused_data
                if not data:
                    return
                self.zlib = zlib.decompressobj(wbits=31)  # the next gzip member
            else:
                data = self.zlib.unconsumed_tail
                if not data and len(block) < INFLATE_MAX:  # a full block may leave output pending: ask again
                    return

    def complete(self) -> bool:
        return self.zlib.eof


@dataclasses.dataclass
class Layer:
    number: int
    blob: dict
    offset: int
    tar: str
    tar_bytes: int = 0
    seconds: float = 0.0


def verify_layer(stream: Stream, layer: Layer, cancel: threading.Event) -> Layer:
    """Read the layer's blob back from the pieces into an uncompressed tar: the blob's sha256 and the tar's
    (diff_id) checked."""
    started = time.monotonic()
    blob = layer.blob
    blob_hash, tar_hash = hashlib.sha256(), hashlib.sha256()
    inflater = Inflater() if blob["kind"] == "gzip" else None
    with open(layer.tar, "wb") as out:
        try:
            for block in stream.chunks(layer.offset, blob["size"]):
                if cancel.is_set():
                    return layer
                blob_hash.update(block)
                for data in inflater.feed(block) if inflater else (block,):
                    tar_hash.update(data)
                    out.write(data)
                    layer.tar_bytes += len(data)
        except zlib.error as exc:
            raise Failed(
                f"layer {layer.number} ({short(blob['digest'])}) is not valid gzip ({exc}): pack the image again"
            ) from None
    if f"sha256:{blob_hash.hexdigest()}" != blob["digest"]:
        raise Failed(f"layer {layer.number}: its bytes in the pieces are not blob {short(blob['digest'])}; pack again")
    if inflater and not inflater.complete():
        raise Failed(f"layer {layer.number} ({short(blob['digest'])}): the gzip stream ends early; pack again")
    if f"sha256:{tar_hash.hexdigest()}" != blob["diff_id"]:
        raise Failed(
            f"layer {layer.number} ({short(blob['digest'])}): its tar is sha256:{tar_hash.hexdigest()[:12]}…, the "
            f"config's diff_id is {short(blob['diff_id'])}"
        )
    layer.seconds = time.monotonic() - started
    return layer


def load_image(directory: str, sums: dict[str, str]) -> dict:
    try:
        with open(os.path.join(directory, IMAGE_JSON)) as handle:
            image = json.load(handle)
    except ValueError:
        raise Failed(f"{directory}/{IMAGE_JSON} is not JSON; copy it again") from None
    if image.get("format") != FORMAT:
        raise Bad(f"{directory}/{IMAGE_JSON} is format {image.get('format')!r}, not {FORMAT}; pack with this script")
    unlisted = [name for name in image["pieces"] if name not in sums]
    if unlisted:
        raise Bad(f"{SUMS} does not list {unlisted[0]}; copy the directory `pack --out` wrote again")
    if f"sha256:{hashlib.sha256(image['manifest'].encode()).hexdigest()}" != image["manifest_digest"]:
        raise Failed(f"{IMAGE_JSON}: the manifest does not match its digest {short(image['manifest_digest'])}")
    manifest = json.loads(image["manifest"])
    named = [manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]
    if named != [blob["digest"] for blob in image["blobs"]]:
        raise Failed(f"{IMAGE_JSON}: its blobs are not the manifest's config and layers; pack again")
    return image


def empty_root(root: str) -> bool:
    """Make ROOT (new or empty); True when it was made here."""
    if os.path.lexists(root):
        if not os.path.isdir(root) or os.path.islink(root) or os.listdir(root):
            raise Bad(f"{root} exists and is not an empty directory: give unpack a new or empty ROOT")
        return False
    os.makedirs(root)
    return True


def unpack(args: argparse.Namespace) -> int:
    directory, root = os.path.abspath(args.dir), os.path.realpath(args.root)
    if not os.path.isdir(directory):
        raise Bad(f"{directory} is not a directory: give the directory `pack --out` wrote")
    started = time.monotonic()
    sums = read_sums(directory)
    check_sums(directory, sums)
    image = load_image(directory, sums)
    say(
        f"unpack: {SUMS} ok ({len(sums)} files, {time.monotonic() - started:.1f} s); {image['ref']} {image['platform']}"
    )
    stream = Stream(directory, image["pieces"], image["piece_bytes"], image["total_bytes"])
    config_blob = image["blobs"][0]
    config_bytes = b"".join(stream.chunks(0, config_blob["size"]))
    if f"sha256:{hashlib.sha256(config_bytes).hexdigest()}" != image["config_digest"]:
        raise Failed(f"the config blob in the pieces does not match {short(image['config_digest'])}; pack again")
    config = json.loads(config_bytes)
    made = empty_root(root)
    try:
        extracted = _unpack_layers(stream, image, root)
    except BaseException as exc:
        if made:
            shutil.rmtree(root, ignore_errors=True)
        left = f"{root} {'was removed' if made else 'is incomplete: empty it before unpacking again'}"
        if isinstance(exc, (Bad, Failed)):
            raise type(exc)(f"{exc} ({left})") from None
        warn(left)
        raise
    meta = {key: image[key] for key in ("format", "ref", "platform", "index_digest", "manifest_digest")}
    meta.update(config_digest=image["config_digest"], config=config, layers=extracted, unpacked=time.time())
    with open(root.rstrip("/") + ".image.json", "w") as handle:
        json.dump(meta, handle, indent=1)
        handle.write("\n")
    seconds = time.monotonic() - started
    say(f"unpack: {len(extracted)} layers into {root} in {seconds:.1f} s; its config: {root}.image.json")
    say(f"unpack: start it with: python3 gpu_offline.py run {root} [--entrypoint PROG] -- ARGS")
    return 0


def _unpack_layers(stream: Stream, image: dict, root: str) -> list[dict]:
    layers, offset = [], 0
    work = tempfile.mkdtemp(prefix=".gpu-offline-", dir=os.path.dirname(root))
    for number, blob in enumerate(image["blobs"]):
        if blob["role"] == "layer":
            layers.append(Layer(number, blob, offset, os.path.join(work, f"layer-{number:03d}.tar")))
        offset += blob["size"]
    cancel = threading.Event()
    extractor = Extractor(root)
    extracted = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(layers), os.cpu_count() or 1)))
    try:
        futures = [pool.submit(verify_layer, stream, layer, cancel) for layer in layers]
        for future in futures:
            layer = future.result()
            counts = extractor.layer(layer.tar)
            os.unlink(layer.tar)
            blob = layer.blob
            say(
                f"  layer {layer.number}/{len(layers)} {blob['digest']}  {human(blob['size'])} -> "
                f"{human(layer.tar_bytes)}  diff_id ok ({layer.seconds:.1f} s)  {counts.describe()}"
            )
            extracted.append({"digest": blob["digest"], "diff_id": blob["diff_id"], **dataclasses.asdict(counts)})
    finally:
        cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(work, ignore_errors=True)
    return extracted


@dataclasses.dataclass
class Counts:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    devices: int = 0
    whiteouts: int = 0
    skipped: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        text = f"{self.files} files, {self.dirs} dirs, {self.symlinks} symlinks, {self.hardlinks} hardlinks"
        if self.devices:
            text += f", {self.devices} devices"
        if self.whiteouts:
            text += f", {self.whiteouts} whiteouts"
        if self.skipped:
            text += f", {self.skipped} skipped (devices need root)"
        return text + f" ({self.seconds:.1f} s)"


def member_path(name: str) -> str | None:
    """A tar member's path relative to the root ('.' and the root itself: None)."""
    path = posixpath.normpath("/" + name).lstrip("/")
    return path or None


def in_root(root: str, relative: str, follow_last: bool = False) -> str:
    """`relative` resolved inside `root` as a chroot would see it: symlinks in its parents followed with `root` as
    `/` ('..' stops there), the last part followed only with `follow_last`. Never a path outside `root`."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        if (parts or follow_last) and os.path.islink(here):
            hops += 1
            if hops > 40:
                raise Failed(f"too many symbolic links under {root} at /{'/'.join(done + [part])}")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        done.append(part)
    return os.path.join(root, *done)


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


class Extractor:
    """Layers applied in order onto one root, as overlayfs stacks them: `.wh.NAME` removes NAME from the layers
    below, `.wh..wh..opq` empties its directory of what the layers below put there; an entry replaces what was
    there unless both are directories. Owners (numeric), modes (setuid kept), mtimes, xattrs, symlinks and
    hardlinks kept; device nodes made only as root."""

    def __init__(self, root: str):
        self.root = root
        self.privileged = os.geteuid() == 0

    def layer(self, tar_path: str) -> Counts:
        started = time.monotonic()
        counts = Counts()
        written: set[str] = set()
        opaque: list[str] = []
        dirs: list[tuple[str, tarfile.TarInfo]] = []
        with tarfile.open(tar_path, "r:") as archive:
            while (member := archive.next()) is not None:
                archive.members.clear()  # one pass, no random access: keep no index of a 100,000-file layer
                relative = member_path(member.name)
                if relative is None:
                    continue
                parent, base = posixpath.split(relative)
                if base.startswith(".wh."):
                    counts.whiteouts += 1
                    if base == ".wh..wh..opq":
                        opaque.append(in_root(self.root, parent))
                    elif not base.startswith(".wh..wh."):
                        remove(os.path.join(in_root(self.root, parent), base[4:]))
                    continue
                path = os.path.join(in_root(self.root, parent), base)
                self.entry(archive, member, path, counts)
                written.add(path)
                if member.isdir():
                    dirs.append((path, member))
        for directory in opaque:
            self.make_opaque(directory, written)
        for path, member in reversed(dirs):
            if os.path.isdir(path):
                os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
        counts.seconds = time.monotonic() - started
        return counts

    def make_opaque(self, directory: str, written: set[str]) -> None:
        """Remove what the layers below left in `directory`, at any depth; keep what this layer wrote there."""
        if not os.path.isdir(directory) or os.path.islink(directory):
            return
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if path not in written:
                remove(path)
            elif os.path.isdir(path) and not os.path.islink(path):
                self.make_opaque(path, written)

    def entry(self, archive: tarfile.TarFile, member: tarfile.TarInfo, path: str, counts: Counts) -> None:
        if os.path.lexists(path) and not (member.isdir() and os.path.isdir(path) and not os.path.islink(path)):
            remove(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if member.isdir():
            os.makedirs(path, exist_ok=True)
            counts.dirs += 1
        elif member.isreg():
            source = archive.extractfile(member)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            counts.files += 1
        elif member.issym():
            os.symlink(member.linkname, path)
            counts.symlinks += 1
        elif member.islnk():
            target = member_path(member.linkname)
            source = in_root(self.root, target) if target else self.root
            if not os.path.lexists(source):
                raise Failed(f"hardlink /{member.name} names /{member.linkname}, which no layer holds")
            os.link(source, path, follow_symlinks=False)
            counts.hardlinks += 1
            return  # the same inode: its owner and mode are the target's
        elif member.ischr() or member.isblk() or member.isfifo():
            if not self.privileged and not member.isfifo():
                counts.skipped += 1
                return
            kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK if member.isblk() else stat.S_IFIFO
            os.mknod(path, kind | (member.mode & 0o7777), os.makedev(member.devmajor, member.devminor))
            counts.devices += 1
        else:
            counts.skipped += 1
            return
        self.attributes(member, path)

    def attributes(self, member: tarfile.TarInfo, path: str) -> None:
        if self.privileged:
            os.lchown(path, member.uid, member.gid)  # before chmod: chown drops the setuid bits
        for key, value in member.pax_headers.items():
            if key.startswith("SCHILY.xattr."):
                try:
                    os.setxattr(path, key[13:], value.encode("utf-8", "surrogateescape"), follow_symlinks=False)
                except OSError:
                    pass  # a file system without that xattr namespace (security.* on tmpfs as non-root)
        if not member.issym():
            os.chmod(path, member.mode & 0o7777)
            os.utime(path, (member.mtime, member.mtime))
        else:
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


# -- run -----------------------------------------------------------------------------------------------------------


def driver_files() -> tuple[dict[str, str], dict[str, str]]:
    """The host's NVIDIA driver libraries ({file name: real path}, from `ldconfig -p` and the usual directories) and
    binaries ({name: path})."""
    candidates: list[str] = []
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)$", line)
        if match and "x86-64" in match.group(2):
            candidates.append(match.group(3))
    for directory in LIB_DIRS:
        candidates += sorted(glob.glob(os.path.join(directory, "lib*.so*")))
    libraries: dict[str, str] = {}
    for path in candidates:
        name = os.path.basename(path)
        if not any(fnmatch.fnmatch(name, pattern) for pattern in LIB_PATTERNS):
            continue
        if any(fnmatch.fnmatch(name, pattern) for pattern in LIB_EXCLUDED):
            continue
        real = os.path.realpath(path)
        if os.path.isfile(real):
            libraries.setdefault(os.path.basename(real), real)
    binaries = {}
    for name in DRIVER_BINARIES:
        for directory in BIN_DIRS:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                binaries[name] = os.path.realpath(path)
                break
    return libraries, binaries


def mount(*argv: str) -> None:
    result = subprocess.run(["mount", *argv], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = " ".join(result.stderr.split()) or f"exit {result.returncode}"
        raise Failed(f"mount {' '.join(argv)} failed ({said}): run as root on a host that allows mounts")


class Session:
    """What `run` changes in ROOT, undone in reverse order on exit: mounts unmounted, files and directories it
    made removed, files it changed (/etc/hosts, ld.so.cache, the library directory's symlinks) put back."""

    def __init__(self, root: str):
        self.root = root
        self.undo: list[tuple[str, ...]] = []

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)  # the cleanup runs to its end
        problems = []
        for action in reversed(self.undo):
            try:
                self._undo(action)
            except OSError as error:
                problems.append(f"{action[0]} {action[1]}: {error.strerror or error}")
        self.undo.clear()
        for problem in problems:
            warn(f"cleanup: {problem}; undo it by hand (umount -R -l PATH for a mount)")

    def _undo(self, action: tuple[str, ...]) -> None:
        kind, path = action[0], action[1]
        if kind == "mount":
            for argv in (["umount", "-R", path], ["umount", "-R", "-l", path]):
                if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
                    return
            raise OSError(errno.EBUSY, "still mounted")
        if kind == "made":
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)
        elif kind == "file":
            remove(path)
            if action[2] == "link":
                os.symlink(action[3], path)
            elif action[2] == "data":
                with open(path, "wb") as handle:
                    handle.write(base64.b64decode(action[3]))
                os.chmod(path, int(action[4]))
        elif kind == "links":
            before = json.loads(action[2])
            for name in os.listdir(path):
                full = os.path.join(path, name)
                if os.path.islink(full) and before.get(name) != os.readlink(full):
                    os.unlink(full)
            for name, target in before.items():
                if not os.path.lexists(os.path.join(path, name)):
                    os.symlink(target, os.path.join(path, name))

    def place(self, relative: str, directory: bool) -> str:
        """A mount point inside ROOT (a directory or an empty file), made when missing and removed on exit; refused
        where ROOT holds a symlink (a mount would follow it out of ROOT)."""
        path = in_root(self.root, relative)
        if os.path.islink(path):
            raise Bad(f"{relative} is a symbolic link in {self.root}; bind to the path it points to instead")
        missing = []
        walk = path
        while not os.path.lexists(walk):
            missing.append(walk)
            walk = os.path.dirname(walk)
        for made in reversed(missing):
            if made == path and not directory:
                with open(made, "x"):
                    pass
            else:
                os.mkdir(made, 0o755)
            self.undo.append(("made", made))
        if directory != os.path.isdir(path):
            raise Bad(f"{relative} in {self.root} is {'not ' if directory else ''}a directory; bind a matching path")
        return path

    def bind(self, source: str, relative: str, recursive: bool = False, read_only: bool = False) -> str:
        target = self.place(relative, os.path.isdir(source))
        mount("--rbind" if recursive else "--bind", source, target)
        self.undo.append(("mount", target))
        if recursive:
            mount("--make-rslave", target)  # unmounting it later must not reach the host's own mounts
        if read_only:
            mount("-o", "remount,bind,ro", target)
        return target

    def keep(self, relative: str) -> str:
        """Remember a file of ROOT as it is (content and mode, a link's target, or absence) to put back on exit."""
        path = in_root(self.root, relative)
        if os.path.islink(path):
            self.undo.append(("file", path, "link", os.readlink(path)))
        elif os.path.isfile(path):
            with open(path, "rb") as handle:
                data = base64.b64encode(handle.read()).decode()
            self.undo.append(("file", path, "data", data, str(stat.S_IMODE(os.stat(path).st_mode))))
        else:
            self.undo.append(("file", path, "absent"))
        return path

    def keep_links(self, relative: str) -> None:
        """Remember a directory's symlinks (ldconfig makes soname links) to put back on exit."""
        path = in_root(self.root, relative)
        links = {
            name: os.readlink(os.path.join(path, name))
            for name in os.listdir(path)
            if os.path.islink(os.path.join(path, name))
        }
        self.undo.append(("links", path, json.dumps(links)))


def parse_bind(text: str) -> tuple[str, str, bool]:
    parts = text.split(":")
    read_only = len(parts) == 3 and parts[2] == "ro"
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise Bad(f"--bind {text!r}: give HOST_PATH:CONTAINER_PATH or HOST_PATH:CONTAINER_PATH:ro")
    host, container = os.path.abspath(parts[0]), parts[1]
    if not os.path.exists(host):
        raise Bad(f"--bind {text!r}: {host} does not exist here; copy it to this host first")
    if not container.startswith("/"):
        raise Bad(f"--bind {text!r}: the container path must be absolute")
    return host, container, read_only


def image_user(root: str, user: str) -> tuple[int, int, str]:
    """uid, gid and home of the config's User (`name`, `uid`, `name:group`, `uid:gid`), from ROOT's passwd."""
    name, _, group = (user or "0").partition(":")

    def table(path: str) -> list[list[str]]:
        try:
            with open(in_root(root, path), errors="replace") as handle:
                return [line.split(":") for line in handle.read().splitlines() if line.count(":") >= 3]
        except OSError:
            return []

    passwd = table("/etc/passwd")
    entry = next((row for row in passwd if row[0] == name or (name.isdigit() and row[2] == name)), None)
    if entry is None and not name.isdigit():
        raise Bad(f"the image's User {user!r} is not in {root}/etc/passwd; the image is incomplete, unpack it again")
    uid = int(entry[2]) if entry else int(name)
    gid = int(entry[3]) if entry and len(entry) > 3 else uid
    home = entry[5] if entry and len(entry) > 5 else "/"
    if group:
        row = next((row for row in table("/etc/group") if row[0] == group), None)
        if row is None and not group.isdigit():
            raise Bad(f"the image's User {user!r}: no group {group!r} in {root}/etc/group; unpack it again")
        gid = int(row[2]) if row else int(group)
    return uid, gid, home


def image_env(config: dict, home: str) -> dict[str, str]:
    env = {}
    for item in config.get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOSTNAME", socket.gethostname())
    env.setdefault("HOME", home)
    return env


def run(args: argparse.Namespace) -> int:
    root = os.path.realpath(args.root)
    try:
        with open(root + ".image.json") as handle:
            meta = json.load(handle)
    except FileNotFoundError:
        raise Bad(f"{root}.image.json is missing: make ROOT with `gpu_offline.py unpack DIR {root}`") from None
    if os.geteuid() != 0:
        raise Bad("run mounts into ROOT and chroots: run it as root (sudo)")
    config = meta["config"].get("config") or {}
    entrypoint = [args.entrypoint] if args.entrypoint else list(config.get("Entrypoint") or [])
    argv = entrypoint + (list(args.args) if args.args or args.entrypoint else list(config.get("Cmd") or []))
    if not argv:
        raise Bad("the image has no Entrypoint or Cmd: name the program with --entrypoint")
    binds = [parse_bind(text) for text in args.bind]
    uid, gid, home = image_user(root, config.get("User") or "")
    env = image_env(config, home)
    workdir = config.get("WorkingDir") or "/"
    say(f"run: {meta['ref']} {meta['platform']} (manifest {short(meta['manifest_digest'])}) in {root}")
    labels = config.get("Labels") or {}
    if labels.get("io.carry.runtime.docker-args"):
        say(f"run: the image asks docker for {labels['io.carry.runtime.docker-args']!r}; a chroot shares the host's")
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, on_signal)
    with Session(root) as session:
        prepare(session, binds, workdir)
        return spawn(root, argv, env, workdir, (uid, gid))


def prepare(session: Session, binds: list[tuple[str, str, bool]], workdir: str) -> None:
    for name in ("proc", "sys", "dev"):
        session.bind(f"/{name}", f"/{name}", recursive=True)
    libraries, binaries = driver_files()
    lib_dir = "/usr/lib/x86_64-linux-gnu"
    if not os.path.isdir(in_root(session.root, lib_dir)) and os.path.isdir(in_root(session.root, "/usr/lib64")):
        lib_dir = "/usr/lib64"
    if libraries:
        session.keep_links(lib_dir)
        for name, path in sorted(libraries.items()):
            session.bind(path, f"{lib_dir}/{name}")
        for name, path in sorted(binaries.items()):
            session.bind(path, f"/usr/bin/{name}")
        if os.path.exists(PERSISTENCED_SOCKET):
            session.bind(PERSISTENCED_SOCKET, PERSISTENCED_SOCKET)
        say(
            f"run: driver: {len(libraries)} libraries into {lib_dir} "
            f"({', '.join(sorted(libraries)[:6])}{', …' if len(libraries) > 6 else ''}); "
            f"{', '.join(sorted(binaries)) or 'no nvidia-smi'} into /usr/bin"
        )
        ldconfig(session, lib_dir)
    else:
        say(f"run: driver: no NVIDIA driver libraries found (ldconfig -p, {', '.join(LIB_DIRS)}): no GPU in ROOT")
    hosts = session.keep("/etc/hosts")
    if os.path.isdir(os.path.dirname(hosts)):
        remove(hosts)
        with open(hosts, "w") as handle:
            handle.write(
                f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{socket.gethostname()}\n"
            )
    for host, container, read_only in binds:
        session.bind(host, container, recursive=os.path.isdir(host), read_only=read_only)
        say(f"run: bound {host} at {container}{' (read-only)' if read_only else ''}")
    if not os.path.isdir(in_root(session.root, workdir)):
        session.place(workdir, directory=True)


def ldconfig(session: Session, lib_dir: str) -> None:
    """`ldconfig` inside ROOT (soname links and the cache for the driver libraries), libcuda.so beside
    libcuda.so.1 as the toolkit's create-symlinks hook makes it."""
    session.keep("/etc/ld.so.cache")
    session.keep("/var/cache/ldconfig/aux-cache")
    env = {"PATH": DEFAULT_PATH}
    try:
        result = subprocess.run(
            ["chroot", session.root, "ldconfig"], env=env, capture_output=True, text=True, timeout=300, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise Failed(f"chroot {session.root} ldconfig could not start ({exc}); is chroot installed?") from None
    if result.returncode != 0:
        said = " ".join(result.stderr.split())[:300]
        warn(f"ldconfig in {session.root} failed ({said or result.returncode}); the driver may not be found there")
        return
    directory = in_root(session.root, lib_dir)
    unversioned = os.path.join(directory, "libcuda.so")
    if os.path.lexists(os.path.join(directory, "libcuda.so.1")) and not os.path.lexists(unversioned):
        os.symlink("libcuda.so.1", unversioned)
        session.undo.append(("made", unversioned))


CHILD: list[subprocess.Popen] = []  # the command `run` started, while it runs


def on_signal(signum: int, _frame: object) -> None:
    """SIGTERM and SIGHUP: passed on to the command while it runs (it then exits and `run` cleans up), else `run`
    stops and cleans up. SIGINT reaches the command from the terminal itself; `run` waits for it."""
    if CHILD and CHILD[0].poll() is None:
        if signum != signal.SIGINT:
            CHILD[0].send_signal(signum)
        return
    raise Failed(f"stopped by {signal.Signals(signum).name}; what run had set up in ROOT is undone")


def spawn(root: str, argv: list[str], env: dict[str, str], workdir: str, ids: tuple[int, int]) -> int:
    """`env -i ENV chroot ROOT ARGV` in WORKDIR as the image's user; SIGTERM, SIGHUP and SIGINT passed on."""
    uid, gid = ids

    def enter() -> None:
        os.chroot(root)
        os.chdir(workdir)
        if (uid, gid) != (0, 0):
            os.setgroups([gid])
            os.setgid(gid)
            os.setuid(uid)

    say(f"run: env -i <{len(env)} vars of the image> chroot {root} {shlex.join(argv)}  (cwd {workdir}, uid {uid})")
    started = time.monotonic()
    try:
        child = subprocess.Popen(argv, env=env, preexec_fn=enter, close_fds=True)  # no threads run here
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise Bad(
            f"{argv[0]} cannot be started in {root} ({exc.strerror}; PATH={env['PATH']}): name the program with "
            f"--entrypoint (an absolute path inside the image)"
        ) from None
    except subprocess.SubprocessError as exc:
        raise Failed(f"could not enter {root} (chroot, cd {workdir}): {exc}") from None
    CHILD.append(child)
    try:
        status = child.wait()
    finally:
        CHILD.clear()
    say(f"run: {argv[0]} exited {status} after {time.monotonic() - started:.1f} s")
    return status if status >= 0 else 128 - status


# -- command line --------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{PROG}: {message}: see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="gpu_offline.py", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    packing = commands.add_parser("pack", help="registry -> DIR of pieces (here)")
    packing.add_argument("ref")
    packing.add_argument("--platform", default="linux/amd64")
    packing.add_argument("--out", required=True)
    packing.add_argument("--piece-mib", type=int, default=60)
    packing.set_defaults(func=pack)
    unpacking = commands.add_parser("unpack", help="DIR of pieces -> ROOT (on the GPU host)")
    unpacking.add_argument("dir")
    unpacking.add_argument("root")
    unpacking.set_defaults(func=unpack)
    running = commands.add_parser("run", help="start ROOT's image with the host's driver (on the GPU host)")
    running.add_argument("root")
    running.add_argument("--bind", action="append", default=[], metavar="HOST:CONTAINER[:ro]")
    running.add_argument("--entrypoint")
    running.add_argument("args", nargs="*")
    running.set_defaults(func=run)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:  # run's ARGS, taken apart here: argparse's subparsers mishandle `--`
        argv, tail = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser().parse_args(argv)
    if tail and args.command != "run":
        parser().error(f"{args.command} takes no arguments after --")
    if args.command == "run":
        args.args = [*args.args, *tail]
    try:
        return args.func(args)
    except Bad as exc:
        warn(str(exc))
        return 2
    except Failed as exc:
        warn(str(exc))
        return 1
    except KeyboardInterrupt:
        warn("interrupted; run it again")
        return 130
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        fix = {errno.ENOSPC: "free space there", errno.EACCES: "run it as root", errno.EPERM: "run it as root"}
        warn(f"{exc.strerror or exc}{where}: {fix.get(exc.errno, 'check the path and run it again')}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

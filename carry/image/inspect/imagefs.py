"""An image's filesystem read on this machine from its layers, for any platform: nothing runs in a container, nothing is
emulated and nothing is unpacked to disk. The layers come from the registry (each blob checked against its digest as it
streams) or, for a ref no registry has, from `docker save` (each layer checked against the config's diff_ids); each is
scanned on its own, then applied in order with its OCI whiteouts into the final view of the paths asked for: kinds,
modes, sizes and sha256, a few files kept whole or by their head, shared objects parsed for the gate as they stream."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import posixpath
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from carry.image import registryhttp
from carry.image.inspect import tarstream
from carry.platforms import Platform
from carry.util.errors import Failed

if TYPE_CHECKING:
    import docker
    from _typeshed import WriteableBuffer

CHUNK = 1 << 20
HEAD = 256
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
GZIP_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip")
TAR_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar")
GZIP_MAGIC = b"\x1f\x8b"
READ_TIMEOUT_S = 120


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which paths to read: those under `prefixes` are recorded (files hashed); `keep` ones are kept whole, `head`
    ones keep their first bytes, `shared` ones are parsed as shared objects by `parse_shared(path, bytes)`."""

    prefixes: tuple[str, ...]
    keep: Callable[[str], bool] = lambda path: False
    head: Callable[[str], bool] = lambda path: False
    shared: Callable[[str], bool] = lambda path: False
    parse_shared: Callable[[str, bytes], object] | None = None

    def wants(self, path: str) -> bool:
        return path.startswith(self.prefixes)


@dataclasses.dataclass(frozen=True)
class Node:
    """One path of the final view: `kind` file, symlink or dir; `sha256` hex of a file's bytes; `data` the whole
    file (kept ones) or its head; `shared` what parse_shared made of it; `layer` the index of the layer it is from."""

    path: str
    kind: str
    mode: int
    size: int = 0
    sha256: str = ""
    target: str = ""
    data: bytes | None = None
    shared: object | None = None
    layer: int = -1

    def record_hash(self) -> str:
        """The sha256 as a RECORD row writes it (`sha256=<urlsafe base64, no padding>`)."""
        return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(self.sha256)).rstrip(b"=").decode()


@dataclasses.dataclass
class LayerScan:
    """What one layer adds (`nodes`) and hides in the layers below it (`whiteouts`: paths, `opaque`: directories
    whose lower contents are hidden); `entries` and `bytes` count the whole layer, `digest` names it."""

    digest: str
    nodes: dict[str, Node] = dataclasses.field(default_factory=dict)
    whiteouts: set[str] = dataclasses.field(default_factory=set)
    opaque: set[str] = dataclasses.field(default_factory=set)
    entries: int = 0
    bytes: int = 0
    compressed: int = 0


@dataclasses.dataclass(frozen=True)
class LayerFacts:
    digest: str
    compressed: int
    bytes: int
    entries: int
    selected: int


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """One platform's image read from its layers: where from, its config, its layers and the final view."""

    ref: str
    platform: Platform
    source: str
    digest: str
    config: dict
    layers: tuple[LayerFacts, ...]
    nodes: dict[str, Node]
    seconds: float

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.config.get("config") or {}).get("Labels") or {})

    def resolve(self, path: str, depth: int = 0) -> Node | None:
        """The node `path` names, symlinks followed (within the view)."""
        node = self.nodes.get(path)
        if node is None or node.kind != "symlink" or depth > 16:
            return node
        return self.resolve(posixpath.normpath(posixpath.join(posixpath.dirname(path), node.target)), depth + 1)


# --- scanning one layer ------------------------------------------------------------------------------------------


def scan_layer(stream: io.BufferedIOBase, digest: str, selection: Selection, layer: int) -> LayerScan:
    """Read one uncompressed layer tar from `stream` front to back."""
    scan = LayerScan(digest)
    reader = tarstream.Reader(stream, f"layer {digest[:19]}")
    try:
        while (header := reader.next()) is not None:
            scan.entries += 1
            _take(reader, header, scan, selection, layer)
    except (OSError, ValueError, EOFError) as exc:
        raise Failed(f"layer {digest[:19]} is not a readable tar ({exc})") from None
    return scan


def _take(
    reader: tarstream.Reader, header: tarstream.Header, scan: LayerScan, selection: Selection, layer: int
) -> None:
    path = _absolute(header.name)
    directory, name = posixpath.split(path)
    if name == OPAQUE:
        scan.opaque.add(directory)
        return
    if name.startswith(WHITEOUT):
        scan.whiteouts.add(posixpath.join(directory, name[len(WHITEOUT) :]))
        return
    if header.is_file:
        scan.bytes += header.size
    if not selection.wants(path):
        return
    mode = header.mode & 0o7777
    if header.is_dir:
        scan.nodes[path] = Node(path, "dir", mode, layer=layer)
    elif header.is_symlink:
        scan.nodes[path] = Node(path, "symlink", mode, target=header.linkname, layer=layer)
    elif header.is_hardlink:
        source = scan.nodes.get(_absolute(header.linkname))
        if source is not None and source.kind == "file":
            scan.nodes[path] = dataclasses.replace(source, path=path, mode=mode)
        else:  # a hard link to a path outside the selection: its bytes are unknown, which a hash check reports
            scan.nodes[path] = Node(path, "file", mode, sha256="(hard link to an unread path)", layer=layer)
    elif header.is_file:
        scan.nodes[path] = _file_node(reader, header, path, mode, selection, layer)


def _absolute(name: str) -> str:
    """A tar member's name as an absolute path (`./opt/venv/` -> `/opt/venv`)."""
    return posixpath.normpath("/" + name.lstrip("/"))


def _file_node(
    reader: tarstream.Reader, header: tarstream.Header, path: str, mode: int, selection: Selection, layer: int
) -> Node:
    whole = selection.keep(path) or selection.shared(path)
    head = not whole and selection.head(path)
    digest, kept = hashlib.sha256(), list[bytes]()

    def sink(chunk: memoryview) -> None:
        digest.update(chunk)
        if whole or (head and not kept):
            kept.append(bytes(chunk[:HEAD] if head else chunk))

    reader.read_data(sink)
    data = b"".join(kept) if (whole or head) else None
    shared = None
    if selection.shared(path) and selection.parse_shared is not None:
        assert data is not None  # a shared object is kept whole
        shared = selection.parse_shared(path, data)
        data = None
    return Node(path, "file", mode, header.size, digest.hexdigest(), data=data, shared=shared, layer=layer)


# --- applying layers ---------------------------------------------------------------------------------------------


def apply(scans: Iterable[LayerScan]) -> dict[str, Node]:
    """The final view: each layer's whiteouts hide paths of the layers below it (an opaque directory all of its
    lower contents), a non-directory replaces a lower directory with everything under it, then its entries win."""
    view: dict[str, Node] = {}
    for scan in scans:
        gone = set(scan.whiteouts) | {
            path
            for path, node in scan.nodes.items()
            if node.kind != "dir" and path in view and view[path].kind == "dir"
        }
        if gone or scan.opaque:
            view = {path: node for path, node in view.items() if not _hidden(path, gone, scan.opaque)}
        view.update(scan.nodes)
    return view


def _hidden(path: str, gone: set[str], opaque: set[str]) -> bool:
    if path in gone:
        return True
    parent = path
    while parent not in ("/", ""):
        parent = posixpath.dirname(parent)
        if parent in gone or parent in opaque:
            return True
    return False


# --- the registry ------------------------------------------------------------------------------------------------


def repository(ref: str, auth: dict | None, plain_http: bool) -> registryhttp.Repository:
    """The repository `ref` names, read with a timeout of READ_TIMEOUT_S (Docker Hub's API lives on its own host)."""
    repo = registryhttp.Repository.of(registryhttp.repository_of(ref), auth)
    host = "registry-1.docker.io" if repo.host == "docker.io" else repo.host
    return dataclasses.replace(repo, host=host, read_timeout=READ_TIMEOUT_S, plain_http=plain_http)


def reference_of(ref: str) -> str:
    """The tag or digest `ref` names (`latest` when none)."""
    name, _, digest = ref.partition("@")
    tail = name.rsplit("/", 1)[-1]
    return digest or (tail.rsplit(":", 1)[1] if ":" in tail else "latest")


def read_manifest(repo: registryhttp.Repository, reference: str) -> tuple[dict, str] | None:
    """(manifest, its digest), checked against `reference` when that is a digest; None when absent."""
    found = repo.get_manifest(reference)
    if found is None:
        return None
    digest = registryhttp.digest_of(found[1])
    if reference.startswith("sha256:") and digest != reference:
        raise Failed(f"{repo.name}@{reference}: the registry's manifest hashes to {digest}")
    return json.loads(found[1]), digest


class _Checked(io.RawIOBase):
    """A stream that hashes and counts what is read through it; `verify()` compares with the expected digest."""

    def __init__(self, raw: io.BufferedIOBase, digest: str, where: str):
        self.raw, self.expected, self.where = raw, digest, where
        self.hash, self.count = hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer)
        if hasattr(self.raw, "readinto"):
            size = self.raw.readinto(view) or 0
        else:
            data = self.raw.read(len(view))
            size = len(data)
            view[:size] = data
        self.hash.update(view[:size])
        self.count += size
        return size

    def verify(self) -> None:
        while self.read(CHUNK):  # a tar's end may leave padding unread
            pass
        found = "sha256:" + self.hash.hexdigest()
        if found != self.expected:
            raise Failed(f"{self.where}: its bytes hash to {found[:19]}…, not {self.expected[:19]}…")


def platform_manifest(repo: registryhttp.Repository, ref: str, platform: Platform) -> tuple[dict, str] | None:
    """(`platform`'s manifest of `ref`, its digest), through a manifest list; None when the registry lacks `ref`."""
    found = read_manifest(repo, reference_of(ref))
    if found is None:
        return None
    manifest, digest = found
    if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
        entries = [m for m in manifest.get("manifests", []) if _platform_of(m.get("platform") or {}) == str(platform)]
        if not entries:
            held = sorted({_platform_of(m.get("platform") or {}) for m in manifest.get("manifests", [])})
            raise Failed(f"{ref} holds {', '.join(held)}, not {platform}")
        found = read_manifest(repo, entries[0]["digest"])
        if found is None:
            raise Failed(f"{ref}: the registry lists {entries[0]['digest'][:19]} for {platform} but does not have it")
        manifest, digest = found
    return manifest, digest


def _platform_of(entry: dict) -> str:
    name = "/".join(part for part in (entry.get("os"), entry.get("architecture"), entry.get("variant")) if part)
    return {"linux/arm64/v8": "linux/arm64"}.get(name, name)


def from_registry(
    ref: str, platform: Platform, selection: Selection, auth: dict | None, plain_http: bool, workers: int | None = None
) -> ImageFiles | None:
    """`platform`'s image of `ref` read from its registry, several layers at a time; None when it lacks `ref`."""
    start = time.monotonic()
    repo = repository(ref, auth, plain_http)
    found = platform_manifest(repo, ref, platform)
    if found is None:
        return None
    image, digest = found
    config_digest = image["config"]["digest"]
    config_blob = _Checked(repo.open_blob(config_digest), config_digest, f"{ref} config")
    config = json.loads(config_blob.read())
    config_blob.verify()
    seen = _platform_of(config)  # the config names its os, architecture and variant as a list's entry does
    if seen != str(platform):
        raise Failed(f"{ref}: the {platform} manifest's config says {seen}")
    layers = image.get("layers") or []

    def read(index: int) -> LayerScan:
        layer = layers[index]
        checked = _Checked(repo.open_blob(layer["digest"]), layer["digest"], f"{ref} layer {index + 1}")
        with _decompressed(checked, layer.get("mediaType", ""), f"{ref} layer {index + 1}") as stream:
            scan = scan_layer(stream, layer["digest"], selection, index)
            while stream.read(CHUNK):
                pass
        checked.verify()
        scan.compressed = checked.count
        return scan

    count = max(1, min(len(layers), workers or min(4, os.cpu_count() or 1)))
    with ThreadPoolExecutor(count) as pool:
        scans = list(pool.map(read, range(len(layers))))
    return _finish(ref, platform, "registry", digest, config, scans, start)


def _decompressed(checked: _Checked, media_type: str, where: str) -> io.BufferedIOBase:
    if media_type in GZIP_TYPES:
        from isal import igzip_threaded

        return igzip_threaded.open(io.BufferedReader(checked, CHUNK), "rb", threads=1, block_size=CHUNK)
    if media_type in TAR_TYPES:
        return io.BufferedReader(checked, CHUNK)
    raise Failed(f"{where}: layer media type {media_type!r} is not read here (gzip or plain tar layers only)")


def _finish(
    ref: str, platform: Platform, source: str, digest: str, config: dict, scans: list[LayerScan], start: float
) -> ImageFiles:
    facts = tuple(LayerFacts(s.digest, s.compressed, s.bytes, s.entries, len(s.nodes)) for s in scans)
    return ImageFiles(ref, platform, source, digest, config, facts, apply(scans), time.monotonic() - start)


# --- the local engine --------------------------------------------------------------------------------------------


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks (the SDK's `docker save` stream) as a readable stream."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.pending = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        while not self.pending:
            self.pending = next(self.chunks, b"")
            if not self.pending:
                return 0
        view = memoryview(buffer)
        size = min(len(view), len(self.pending))
        view[:size], self.pending = self.pending[:size], self.pending[size:]
        return size


def from_engine(client: docker.DockerClient, ref: str, platform: Platform, selection: Selection) -> ImageFiles:
    """The local image `ref` read from `docker save` as it streams, each layer checked against its diff_id."""
    start = time.monotonic()
    try:
        image = client.images.get(ref)
        stream = io.BufferedReader(_Chunks(iter(client.api.get_image(image.id, chunk_size=CHUNK))), CHUNK)
    except Exception as exc:  # docker.errors.* without importing the SDK here
        raise Failed(f"cannot read {ref} from the local engine: {str(exc).strip().splitlines()[-1:]}") from None
    scans: dict[str, tuple[LayerScan, str]] = {}
    small: dict[str, bytes] = {}
    outer = tarstream.Reader(stream, f"docker save of {ref}")
    while (member := outer.next()) is not None:
        if not member.is_file:
            continue
        if member.size > 16 << 20 or member.name.endswith("layer.tar"):
            scans[member.name] = _scan_saved(outer.member_stream(), member.name, selection)
        else:
            small[member.name] = _read_all(outer)
    manifest = json.loads(small.get("manifest.json", b"[]"))
    if len(manifest) != 1:
        raise Failed(f"{ref}: docker save gave {len(manifest)} image manifests, expected one")
    config = json.loads(small[manifest[0]["Config"]])
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    ordered = []
    for index, name in enumerate(manifest[0]["Layers"]):
        scan, digest = scans.get(name) or _scan_small(small, name, selection)
        if index >= len(diff_ids) or diff_ids[index] != digest:
            raise Failed(f"{ref}: layer {index + 1} ({name}) hashes to {digest[:19]}…, not the config's diff_id")
        ordered.append(
            dataclasses.replace(scan, nodes={p: dataclasses.replace(n, layer=index) for p, n in scan.nodes.items()})
        )
    seen = _platform_of(config)
    if seen != str(platform):
        raise Failed(f"{ref} is a {seen} image, not {platform}")
    return _finish(ref, platform, "local engine", image.id, config, ordered, start)


def _read_all(outer: tarstream.Reader) -> bytes:
    parts: list[bytes] = []
    outer.read_data(lambda chunk: parts.append(bytes(chunk)))
    return b"".join(parts)


def _scan_saved(handle: io.BufferedIOBase, name: str, selection: Selection) -> tuple[LayerScan, str]:
    checked = _Checked(handle, "", name)
    buffered = io.BufferedReader(checked, CHUNK)
    scan = scan_layer(buffered, name, selection, -1)
    while buffered.read(CHUNK):
        pass
    scan.digest = "sha256:" + checked.hash.hexdigest()
    return scan, scan.digest


def _scan_small(small: dict[str, bytes], name: str, selection: Selection) -> tuple[LayerScan, str]:
    if name not in small:
        raise Failed(f"docker save has no {name}")
    data = small[name]
    if data.startswith(GZIP_MAGIC):
        from isal import igzip

        data = igzip.decompress(data)
    scan = scan_layer(io.BytesIO(data), name, selection, -1)
    scan.digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return scan, scan.digest

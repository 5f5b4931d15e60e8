"""VERSION N's fixed wheel, rebuilt from its image in the registry, as the base a fresh runner derives VERSION N+1's
from (carry.wheelbuild.derive): no PEP 517 build, no download of the wheel.

The `vllm-release` layer is the precompiled release wheel installed (this run has it, pinned by sha256), the
`vllm-fixed` layer the difference to the fixed wheel. So the fixed wheel's members are the release wheel's, with the
fixed layer's files over them and its whiteouts taken out. Only the fixed layer is read (kilobytes), checked against the
record's digest and diff_id, and what is rebuilt must install with exactly the RECORD in that layer.

VERSION N's tree must be in the mirror, or made from its series (each patch from this run's patches/ when unchanged,
else from the copy its record carries, held to the buildinfo's sha256) on its pin. Then derive's own checks run, and the
finish proves the result (tree check, gate)."""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import posixpath
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from carry.binaries import buildinfo, wheelzip
from carry.image.locked import wheelinstall
from carry.image.locked.wheelinstall import Venv
from carry.source import apply, git
from carry.source.series import Series, parse_patch
from carry.util import reporter
from carry.util.errors import Failed
from carry.wheelbuild import derive

if TYPE_CHECKING:
    from carry.image.locked.registrycache import Previous
    from carry.wheelbuild.wheel import WheelPlan

FIXED_LAYER = "vllm-fixed"
INSTALLER_FILES = ("INSTALLER", "RECORD", "REQUESTED", "direct_url.json")


def offer(
    previous: Previous | None, venv: Venv, scratch: Path
) -> Callable[[WheelPlan, Path, Series], tuple[derive.Base | None, str]]:
    """What a wheel build calls when this machine has no base: VERSION N's wheel rebuilt from `previous` (or None and
    why)."""

    def made(the_plan: WheelPlan, mirror: Path, series: Series) -> tuple[derive.Base | None, str]:
        if previous is None or previous.record is None:
            return None, "no earlier build here, and no previous image with a record in the registry"
        try:
            return rebuild(previous, the_plan, mirror, series, venv, scratch)
        except (Failed, OSError, ValueError, KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
            return None, f"VERSION N's wheel could not be rebuilt from {previous.ref} ({exc})"

    return made


def rebuild(
    previous: Previous, the_plan: WheelPlan, mirror: Path, series: Series, venv: Venv, scratch: Path
) -> tuple[derive.Base | None, str]:
    started = time.monotonic()
    ref = previous.ref
    entry = previous.by_name(FIXED_LAYER)
    if entry is None or previous.trusted.get(entry.key) is not entry or the_plan.precompiled is None:
        return None, f"{ref} records no trusted {FIXED_LAYER} layer, or this build takes no precompiled wheel"
    layer = _layer(previous, entry.digest, entry.diff_id)
    site = venv.site.lstrip("/")
    info = _dist_info(layer, site)
    if info is None:
        return None, f"{ref}'s {FIXED_LAYER} layer holds no installed dist-info with a carry buildinfo"
    stamped = json.loads(layer.files[f"{info}/carry-buildinfo.json"][1])
    problem = _same_lineage(stamped, the_plan)
    if problem:
        return None, f"{ref}'s wheel ({stamped.get('version')}): {problem}"
    recorded = (previous.record.wheel if previous.record is not None else None) or {}
    tree, why = _tree(stamped, mirror, series, scratch, recorded.get("patches") or [])
    if tree is None:
        return None, why
    release = the_plan.precompiled.path
    scratch.mkdir(parents=True, exist_ok=True)
    wheel = scratch / f"image-base-{entry.digest.split(':', 1)[1][:16]}" / _wheel_name(release, stamped)
    wheel.parent.mkdir(parents=True, exist_ok=True)
    _write_wheel(wheel, release, layer, site, info, venv)
    installed = {e.path: e for e in wheelinstall.plan(wheel, venv).entries}
    record = installed.get(f"{info}/RECORD")
    if record is None or record.data != layer.files[f"{info}/RECORD"][1]:
        wheel.unlink(missing_ok=True)
        return None, f"the wheel rebuilt from {ref} does not install as VERSION {stamped.get('version')} did"
    commit = git.tree_commit(mirror, tree, str((stamped.get("upstream") or {}).get("commit")))
    reporter.phase(
        "derive",
        f"VERSION {stamped.get('version')}'s {wheel.name} rebuilt from {ref} ({entry.size:,} bytes of its "
        f"{FIXED_LAYER} layer read, and {release.name}) in {time.monotonic() - started:.1f}s; it installs as that "
        f"image's RECORD says",
    )
    source = f"VERSION {stamped.get('version')}'s wheel, rebuilt from {ref}"
    return derive.Base(tree, str(stamped.get("cache_key")), commit, wheel, source, temporary=True), ""


class _Layer:
    """A layer's files (path -> (mode, bytes)), directories and whiteouts (the paths they hide)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[int, bytes]] = {}
        self.whiteouts: set[str] = set()


def _layer(previous: Previous, digest: str, diff_id: str) -> _Layer:
    assert previous.repo is not None  # a record was read from it
    blob = previous.repo.get_blob(digest)
    if "sha256:" + hashlib.sha256(blob).hexdigest() != digest:
        raise Failed(f"its {FIXED_LAYER} blob does not hash to {digest[:19]}…")
    raw = gzip.decompress(blob)
    if "sha256:" + hashlib.sha256(raw).hexdigest() != diff_id:
        raise Failed(f"its {FIXED_LAYER} layer does not inflate to its diff_id {diff_id[:19]}…")
    found = _Layer()
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        for member in archive:
            name = member.name.rstrip("/")
            parent, _, base = name.rpartition("/")
            if base.startswith(".wh."):
                found.whiteouts.add(f"{parent}/{base[4:]}" if parent else base[4:])
            elif member.isfile():
                handle = archive.extractfile(member)
                assert handle is not None  # a regular file
                found.files[name] = (member.mode, handle.read())
    return found


def _dist_info(layer: _Layer, site: str) -> str | None:
    for path in layer.files:
        if path.startswith(site + "/") and path.endswith(".dist-info/carry-buildinfo.json"):
            directory = path.rsplit("/", 1)[0]
            if f"{directory}/RECORD" in layer.files and directory.count("/") == site.count("/") + 1:
                return directory
    return None


def _same_lineage(stamped: dict, the_plan: WheelPlan) -> str:
    """Why the image's wheel is not a base of this plan, or ''."""
    assert the_plan.precompiled is not None
    if stamped.get("lineage") != the_plan.lineage:
        return "made by another build (carry, build environment, toolchain, arches or gate policy differ)"
    wanted = the_plan.precompiled.wheel.pinned.sha256
    if (stamped.get("precompiled") or {}).get("sha256") != wanted:
        return f"made from another precompiled wheel, not {wanted[:12]}"
    return ""


def recorded_series(wheel: Path, directory: Path) -> list[dict]:
    """What a locked image's record carries of the fixed wheel's series, for a later run whose patches/ has changed:
    each patch of the wheel's buildinfo, by name, sha256 and its bytes (base64) read from `directory` (the series'
    own); a patch not there as the buildinfo names it is left out (the later run then says it cannot be made)."""
    stamped = buildinfo.peek(wheel) or {}
    found = []
    for patch in (stamped.get("series") or {}).get("patches") or []:
        try:
            data = (directory / str(patch.get("name"))).read_bytes()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() == patch.get("sha256"):
            found.append({"name": patch["name"], "sha256": patch["sha256"], "data": base64.b64encode(data).decode()})
    return found


def _tree(
    stamped: dict, mirror: Path, series: Series, scratch: Path, recorded: list[dict] | None = None
) -> tuple[str | None, str]:
    """VERSION N's tree in the mirror: there already, else its series (this run's patches, else the copies in
    `recorded`) applied onto its pin, giving the tree its buildinfo names."""
    tree = str(stamped.get("tree"))
    if git.object_exists(mirror, tree):
        return tree, ""
    pin = str((stamped.get("upstream") or {}).get("commit"))
    if not git.has_commit(mirror, pin):
        return None, f"VERSION {stamped.get('version')}'s pin {pin[:12]} is not in the mirror"
    mine = {(p.name, p.sha256): p for p in series.patches}
    theirs = (stamped.get("series") or {}).get("patches") or []
    copies = scratch / f"recorded-series-{str(stamped.get('tree'))[:12]}"
    for entry in recorded or []:
        data = base64.b64decode(str(entry.get("data")))
        key = (str(entry.get("name")), hashlib.sha256(data).hexdigest())
        if key not in mine and key[1] == entry.get("sha256") and "/" not in key[0] and key[0].endswith(".patch"):
            copies.mkdir(parents=True, exist_ok=True)
            (copies / key[0]).write_bytes(data)
            mine[key] = parse_patch(copies / key[0], int(key[0].split("-", 1)[0]))
    missing = [p["name"] for p in theirs if (p.get("name"), p.get("sha256")) not in mine]
    if missing:
        return None, (
            f"VERSION {stamped.get('version')}'s patch {missing[0]} is neither in {series.directory} as it was "
            f"(edited or removed since) nor in its record, so its tree cannot be made here"
        )
    subset = Series(series.directory, tuple(mine[(p["name"], p["sha256"])] for p in theirs))
    report = apply.check(mirror, pin, subset, scratch)
    if report.tree != tree:
        return None, (
            f"VERSION {stamped.get('version')}'s series on its pin gives tree {str(report.tree)[:12]}, not {tree[:12]}"
        )
    return tree, ""


def _wheel_name(release: Path, stamped: dict) -> str:
    """The fixed wheel's file name: the release wheel's, with the fixed version (the tags are the release's)."""
    parts = release.name.split("-")
    return "-".join([parts[0], str(stamped.get("wheel_version")), *parts[2:]])


def _write_wheel(wheel: Path, release: Path, layer: _Layer, site: str, info: str, venv: Venv) -> None:
    """The release wheel's members with the layer's files over them and its whiteouts taken out, then the files
    only the layer has, then its dist-info (the installer's files aside) and a RECORD."""
    installed = wheelinstall.plan(release, venv)
    by_member = {entry.member: entry for entry in installed.entries if entry.member}
    hidden = layer.whiteouts
    rows: list[list[str]] = []
    placed: set[str] = set()
    dist = info.rsplit("/", 1)[1]
    with zipfile.ZipFile(release) as archive, open(release, "rb") as raw, zipfile.ZipFile(wheel, "w") as out:
        release_info = wheelzip.dist_info(archive)
        record = {
            row[0]: row for row in csv.reader(archive.read(f"{release_info}/RECORD").decode().splitlines()) if row
        }
        date_time = max((m.date_time for m in archive.infolist()), default=(1980, 1, 1, 0, 0, 0))
        for member in archive.infolist():
            if member.is_dir() or member.filename.startswith(release_info + "/"):
                continue
            if member.filename.endswith((".pyc", ".pyo")):  # not installed (wheelinstall), kept as they are
                wheelzip.copy_member(raw, member, out)
                rows.append(record.get(member.filename) or wheelzip.record_line(member.filename, archive.read(member)))
                continue
            entry = by_member.get(member.filename)
            if entry is None or not entry.path.startswith(site + "/"):
                raise Failed(f"{release.name}: {member.filename} installs outside site-packages")
            path = entry.path
            if any(path == gone or path.startswith(gone + "/") for gone in hidden):
                continue
            placed.add(path)
            if path in layer.files:
                mode, data = layer.files[path]
                _add(out, member.filename, data, member.date_time, mode)
                rows.append(wheelzip.record_line(member.filename, data))
            else:
                wheelzip.copy_member(raw, member, out)
                rows.append(record.get(member.filename) or wheelzip.record_line(member.filename, archive.read(member)))
        for path, (mode, data) in sorted(layer.files.items()):
            if path in placed or not path.startswith(site + "/") or path.startswith(info + "/"):
                continue
            name = path[len(site) + 1 :]
            _add(out, name, data, date_time, mode)
            rows.append(wheelzip.record_line(name, data))
        for path, (mode, data) in sorted(layer.files.items()):
            if path.startswith(info + "/") and posixpath.basename(path) not in INSTALLER_FILES:
                name = f"{dist}/{path[len(info) + 1 :]}"
                _add(out, name, data, date_time, mode)
                rows.append(wheelzip.record_line(name, data))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, [f"{dist}/RECORD", "", ""]])
        _add(out, f"{dist}/RECORD", text.getvalue().encode(), date_time, 0o644)


def _add(out: zipfile.ZipFile, name: str, data: bytes, date_time: tuple, mode: int) -> None:
    entry = zipfile.ZipInfo(name, date_time=date_time)
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = (0o100000 | (0o755 if mode & 0o111 else 0o644)) << 16
    out.writestr(entry, data)

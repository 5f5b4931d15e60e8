"""What a locked image's venv holds, proven from its files: the installed distributions are exactly the lock plus the
fixed wheel, every file matches its RECORD, nothing under site-packages or the venv's bin is in no RECORD, the fixed
wheel is installed as it is in dist/, console scripts run the image's interpreter."""

from __future__ import annotations

import csv
import dataclasses
import email.parser
import hashlib
import posixpath
import re
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from carry.binaries import wheelzip
from carry.binaries.sharedobjects import elf_machine, may_be_shared_object
from carry.image.inspect.imagefs import ImageFiles, Node, Selection
from carry.platforms import Platform
from carry.trust.facts import canonical, same_version
from carry.util.errors import Failed
from carry.util.integrity import file_sha256

VENV = "/opt/venv"
BIN = f"{VENV}/bin"
PYTHON = f"{BIN}/python"
INTERPRETER_PREFIX = "/usr/bin/python"
SITE_RE = re.compile(r"^/opt/venv/lib/python\d+\.\d+/site-packages(?=/|$)")
INSTALLER_FILES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")  # what an installer adds to a dist-info
BIN_LINK_RE = re.compile(r"^python(\d+(\.\d+)?)?$")  # the venv's own interpreter links
CUDA_H = "/include/cuda.h"  # CUDA_HOME's, read whole: the driver stub carry adds is made from it (cudatoolkit)


@dataclasses.dataclass(frozen=True)
class Row:
    """One RECORD row: the path as written (relative to site-packages), `sha256=<b64>` or "", the size or None."""

    path: str
    hash: str
    size: int | None


def parse_record(text: str) -> tuple[Row, ...]:
    rows = []
    for fields in csv.reader(text.splitlines()):
        if not fields:
            continue
        size = fields[2] if len(fields) > 2 else ""
        rows.append(Row(fields[0], fields[1] if len(fields) > 1 else "", int(size) if size.isdigit() else None))
    return tuple(rows)


@dataclasses.dataclass(frozen=True)
class Installed:
    """One `*.dist-info` in site-packages: its name (canonical and as written), version, rows and scripts."""

    name: str
    shown: str
    version: str
    dist_info: str  # absolute path
    rows: tuple[Row, ...]
    scripts: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.shown} {self.version}"


@dataclasses.dataclass(frozen=True)
class FixedWheel:
    """The fixed wheel from dist/: its sha256, dist-info, RECORD rows, shared objects and top-level names."""

    path: Path
    sha256: str
    name: str
    version: str
    dist_info: str
    rows: tuple[Row, ...]
    shared: frozenset[str]
    tops: frozenset[str]

    @classmethod
    def read(cls, path: Path) -> FixedWheel:
        try:
            with zipfile.ZipFile(path) as archive:
                info = wheelzip.dist_info(archive)
                rows = parse_record(archive.read(f"{info}/RECORD").decode())
                metadata = _headers(archive.read(f"{info}/METADATA"))
        except (OSError, KeyError, zipfile.BadZipFile) as exc:
            raise Failed(f"{path}: not a readable wheel ({exc}); rebuild it") from None
        tops = {
            row.path.split("/", 1)[0]
            for row in rows
            if not row.path.split("/", 1)[0].endswith((".dist-info", ".data")) and not row.path.startswith("..")
        }
        shared = frozenset(s for row in rows if may_be_shared_object(row.path) and (s := _installed_path(row.path)))
        name, version = canonical(metadata.get("Name", "")), metadata.get("Version", "")
        return cls(path, file_sha256(path), name, version, info, rows, shared, frozenset(tops))


def _installed_path(wheel_path: str) -> str:
    """Where a wheel member is installed, relative to site-packages (`.data/scripts/x` to `../../../bin/x`, ...); "" for
    `.data/headers`."""
    top, _, rest = wheel_path.partition("/")
    if not top.endswith(".data"):
        return wheel_path
    kind, _, inner = rest.partition("/")
    places = {"purelib": "", "platlib": "", "scripts": "../../../bin/", "data": "../../../"}
    # headers: where pip puts them depends on the distribution's name; left out
    return places[kind] + inner if kind in places else ""


def _headers(data: bytes) -> dict[str, str]:
    message = email.parser.BytesHeaderParser().parsebytes(data)
    return {key: str(value) for key, value in message.items()}


def selection(fixed: Iterable[FixedWheel], parse_shared: Callable[[str, bytes], object]) -> Selection:
    """What the check reads of an image: the venv (dist-info files whole, the bin's heads) and the system
    interpreter's head, and the fixed wheels' shared objects parsed by `parse_shared(path, bytes)`."""
    shared = frozenset(path for wheel in fixed for path in wheel.shared)

    def relative(path: str) -> str | None:
        match = SITE_RE.match(path)
        return path[match.end() + 1 :] if match else None

    def parse(path: str, data: bytes) -> object:
        name = relative(path)
        assert name is not None  # parsed only where `shared` said yes: a path under site-packages
        return parse_shared(name, data)

    return Selection(
        prefixes=(f"{VENV}/", INTERPRETER_PREFIX),
        keep=lambda path: path.startswith(f"{VENV}/lib/") and (".dist-info/" in path or path.endswith(CUDA_H)),
        head=lambda path: path.startswith((f"{BIN}/", INTERPRETER_PREFIX)),
        shared=lambda path: relative(path) in shared,
        # named as in the wheel (`vllm/_C.abi3.so`), so that build.gate's rules match them as they do the wheel's
        parse_shared=parse,
    )


@dataclasses.dataclass(frozen=True)
class ContentCheck:
    """What the files of one platform's image prove, and every problem, each named."""

    platform: Platform
    site: str
    distributions: int
    files: int
    bytes: int
    problems: tuple[str, ...]
    proven: tuple[str, ...]
    shared: tuple  # the fixed wheel's shared objects as the layers hold them (for the gate)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    files: ImageFiles, locked: Iterable[tuple[str, str]], fixed: FixedWheel, wheels: dict[str, Path] | None = None
) -> ContentCheck:
    """The image's venv against the lock (name, version pairs), the fixed wheel and the locked `wheels`' RECORDs."""
    nodes, locked = files.nodes, tuple(locked)
    problems: list[str] = []
    sites = sorted({match.group(0) for path in nodes if (match := SITE_RE.match(path))})
    if len(sites) != 1:
        found = ", ".join(sites) or "none"
        raise Failed(f"{files.ref} {files.platform}: expected one site-packages under {VENV}/lib, found {found}")
    site = sites[0]
    dists = installed(nodes, site, problems)
    shared_paths: list[str] = []
    changed: list[tuple[Installed, Row, Node, str]] = []
    owned, checked, size = _check_records(nodes, site, dists, problems, shared_paths, changed)
    wrong_records = _changed(changed, wheels or {}, problems)
    toolkit = _cuda_home(nodes, site, dict(locked), files.platform, problems)
    problems += _unowned(nodes, site, owned | set(toolkit))
    problems += _against_lock(dists, locked, fixed, site)
    fixed_dist = next((d for d in dists if d.name == fixed.name), None)
    if fixed_dist is not None:
        problems += _against_fixed(nodes, site, fixed_dist, fixed)
    compared = 0
    for dist in dists:
        if wheels and dist.name in wheels and dist.name != fixed.name:
            info, rows, corrected = wheel_record_as_is(wheels[dist.name])
            problems += against_wheel(dist, rows, info, wheels[dist.name].name)
            wrong_records += [f"{dist}: {path}" for path in corrected]
            compared += 1
    problems += _scripts(nodes, dists)
    problems += _interpreter(files)
    shared = tuple(
        node.shared
        for path in sorted(fixed.shared)
        if (node := nodes.get(posixpath.join(site, path))) is not None and node.shared is not None
    )
    notes = (
        (wrong_records, "whose own wheel's RECORD is wrong, installed with the wheel's bytes as pip installs them"),
        (shared_paths, "two locked wheels install, each as one of them has it"),
    )
    proven = (
        f"files: {len(dists)} distribution(s) = the lock's {len(locked)} + the fixed wheel; {checked} "
        f"file(s), {size / 1e6:,.1f} MB, each matching its RECORD; nothing under "
        f"site-packages or {BIN} that no RECORD lists",
        f"fixed wheel: {fixed.path.name} (sha256 {fixed.sha256[:12]}…): {len(fixed.rows) - 1} RECORD file(s) "
        f"installed as in the wheel, nothing else under {', '.join(sorted(fixed.tops)) or '-'}",
        f"locked wheels: {compared} of {len(locked)} installed RECORDs equal to their wheel's in the download "
        f"store (sha256 from the lock)" + ("" if compared == len(locked) else "; the others' taken from the image"),
        f"console scripts: run {PYTHON}",
        *(f"CUDA_HOME's toolkit layout, carry's: {', '.join(_shown(p, site) for p in toolkit)}",) * bool(toolkit),
        *(
            f"note: {len(paths)} file(s) {what}: {'; '.join(paths[:3])}{' …' if len(paths) > 3 else ''}"
            for paths, what in notes
            if paths
        ),
    )
    return ContentCheck(files.platform, site, len(dists), checked, size, tuple(problems), proven, shared)


def installed(nodes: dict[str, Node], site: str, problems: list[str]) -> list[Installed]:
    """Every `*.dist-info` with METADATA directly in site-packages."""
    found = []
    for path in sorted(nodes):
        directory, name = posixpath.split(path)
        if name != "METADATA" or posixpath.dirname(directory) != site or not directory.endswith(".dist-info"):
            continue
        headers = _headers(nodes[path].data or b"")
        record = nodes.get(f"{directory}/RECORD")
        rel = directory[len(site) + 1 :]
        if record is None or record.data is None:
            problems.append(f"{rel}: no RECORD; installed by something other than a wheel installer")
        rows = parse_record((record.data or b"").decode(errors="replace")) if record else ()
        scripts = _console_scripts(nodes.get(f"{directory}/entry_points.txt"))
        name, version = headers.get("Name", rel), headers.get("Version", "?")
        found.append(Installed(canonical(name), name, version, directory, rows, scripts))
    return found


def _console_scripts(node: Node | None) -> tuple[str, ...]:
    if node is None or not node.data:
        return ()
    names, section = [], ""
    for line in node.data.decode(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif "=" in line and section in ("console_scripts", "gui_scripts") and not line.startswith(("#", ";")):
            names.append(line.split("=", 1)[0].strip())
    return tuple(names)


def _check_records(
    nodes: dict[str, Node],
    site: str,
    dists: list[Installed],
    problems: list[str],
    shared: list[str],
    changed: list[tuple[Installed, Row, Node, str]],
) -> tuple[set[str], int, int]:
    owned: set[str] = set()
    checked = size = 0
    claims: dict[str, list[tuple[Installed, Row]]] = {}
    for dist in dists:
        for row in dist.rows:
            claims.setdefault(posixpath.normpath(posixpath.join(site, row.path)), []).append((dist, row))
    for dist in dists:
        for row in dist.rows:
            path = posixpath.normpath(posixpath.join(site, row.path))
            owned.add(path)
            node = nodes.get(path)
            shown = _shown(path, site)
            if node is None:
                problems.append(f"{dist}: {shown} is in its RECORD but not in the image")
                continue
            if not row.hash:
                continue
            if node.kind != "file":
                problems.append(f"{dist}: {shown} is a {node.kind} in the image, a file in its RECORD")
                continue
            checked += 1
            size += node.size
            if node.record_hash() != row.hash or (row.size is not None and row.size != node.size):
                held = node.record_hash()
                winner = next(
                    (other for other, theirs in claims[path] if other is not dist and theirs.hash == held), None
                )
                if winner is not None:  # two locked wheels install this file; the image holds the other's
                    shared.append(f"{shown}: in the RECORDs of {dist} and {winner}; the image holds {winner}'s")
                    continue
                changed.append((dist, row, node, shown))
    return owned, checked, size


def _changed(
    changed: list[tuple[Installed, Row, Node, str]], wheels: dict[str, Path], problems: list[str]
) -> list[str]:
    """Files that differ from their RECORD: a problem, unless the locked wheel itself (from the download store,
    by the lock's sha256) holds exactly these bytes under a RECORD that is wrong about them (pynvvideocodec 2.0.4
    ships such a RECORD; pip installs the bytes, not the claim). Returns those, as notes."""
    upstream_wrong: list[str] = []
    for dist, row, node, shown in changed:
        wheel = wheels.get(dist.name)
        member_hash = None
        if wheel is not None:
            try:
                with zipfile.ZipFile(wheel) as archive:
                    member_hash = wheelzip.record_hash(archive.read(row.path))
            except (OSError, KeyError, zipfile.BadZipFile):
                member_hash = None
        if member_hash is not None and member_hash == node.record_hash():
            upstream_wrong.append(f"{dist}: {shown}")
            continue
        problems.append(
            f"{dist}: {shown} changed: {node.size} bytes {node.record_hash()} "
            f"(layer {node.layer + 1}), RECORD says {row.size} bytes {row.hash}"
        )
    return upstream_wrong


def _cuda_home(
    nodes: dict[str, Node], site: str, pins: dict[str, str], platform: Platform, problems: list[str]
) -> list[str]:
    """The paths carry adds to make the lock's CUDA_HOME a toolkit's layout (cudatoolkit.layout), each checked: the
    links' targets, and the driver stub's bytes as made from the image's own cuda.h."""
    from carry.image.locked import cudatoolkit

    pins = {canonical(name): version for name, version in pins.items()}
    home = cudatoolkit.home_of(pins)
    if home is None:
        return []
    header = nodes.get(f"{site}/{home}{CUDA_H}")
    if header is None or header.data is None:
        problems.append(f"{home}{CUDA_H}: not in the image; the lock's nvidia-cuda-runtime installs it")
        return []
    found = []
    for added in cudatoolkit.layout(site, pins, platform, header.data):
        node, path = nodes.get("/" + added.path), "/" + added.path
        kind, want = ("symlink", added.link) if added.link else ("file", hashlib.sha256(added.data).hexdigest())
        have = node and (node.target if node.kind == "symlink" else node.sha256)
        if node is None or node.kind != kind or have != want:
            problems.append(
                f"{_shown(path, site)}: CUDA_HOME's toolkit layout wants a {kind} "
                f"{added.link or 'made from ' + home + CUDA_H}, the image has "
                f"{'nothing' if node is None else node.kind + ' ' + str(have)[:16]}"
            )
        found.append(path)
    return found


def _shown(path: str, site: str) -> str:
    return path[len(site) + 1 :] if path.startswith(site + "/") else path


def _allowed(path: str, site: str) -> bool:
    parts = path.split("/")
    if "__pycache__" in parts or path.endswith(".pyc"):
        return True
    if path.startswith(f"{BIN}/"):
        return posixpath.dirname(path) == BIN and bool(BIN_LINK_RE.match(parts[-1]))
    directory, name = posixpath.split(path)
    return directory.endswith(".dist-info") and posixpath.dirname(directory) == site and name in ("RECORD", "INSTALLER")


def _unowned(nodes: dict[str, Node], site: str, owned: set[str]) -> list[str]:
    """Files and links under site-packages and the venv's bin that no RECORD lists."""
    return [
        f"{_shown(path, site)} ({node.kind}, layer {node.layer + 1}) belongs to no installed distribution's RECORD"
        for path, node in sorted(nodes.items())
        if node.kind != "dir"
        and (path.startswith(site + "/") or path.startswith(f"{BIN}/"))
        and path not in owned
        and not _allowed(path, site)
    ]


def _against_lock(dists: list[Installed], locked: Iterable[tuple[str, str]], fixed: FixedWheel, site: str) -> list[str]:
    wanted = {canonical(name): version for name, version in locked}
    wanted.setdefault(fixed.name, fixed.version)
    problems: list[str] = []
    by_name: dict[str, list[Installed]] = {}
    for dist in dists:
        by_name.setdefault(dist.name, []).append(dist)
    for name, found in sorted(by_name.items()):
        where = ", ".join(_shown(d.dist_info, site) for d in found)
        if len(found) > 1:
            problems.append(f"{name} is installed {len(found)} times ({where})")
        if name not in wanted:
            problems.append(f"{found[0]} is installed ({where}) but is not in the lock")
        elif not any(same_version(d.version, wanted[name]) for d in found):
            what = "the fixed wheel is" if name == fixed.name else "the lock pins"
            problems.append(
                f"{name} {', '.join(d.version for d in found)} is installed ({where}); {what} {wanted[name]}"
            )
    problems += [
        f"{name}=={version} is in the {'lock' if name != fixed.name else 'image as the fixed wheel'} but not installed"
        for name, version in sorted(wanted.items())
        if name not in by_name
    ]
    return problems


def _against_fixed(nodes: dict[str, Node], site: str, dist: Installed, fixed: FixedWheel) -> list[str]:
    """The installed fixed wheel equals the wheel from dist/: its dist-info directory, its RECORD as the wheel's
    (`against_wheel`), and nothing under the wheel's top-level names that the wheel does not have."""
    problems = []
    if posixpath.basename(dist.dist_info) != fixed.dist_info:
        problems.append(
            f"{dist}: installed as {posixpath.basename(dist.dist_info)}, the fixed wheel's is {fixed.dist_info}"
        )
    problems += against_wheel(dist, fixed.rows, fixed.dist_info, "the fixed wheel")
    expected = {posixpath.normpath(target) for row in fixed.rows if (target := _installed_path(row.path))}
    tops = tuple(fixed.tops)
    for path, node in sorted(nodes.items()):
        if node.kind == "dir" or not path.startswith(site + "/"):
            continue
        rel = path[len(site) + 1 :]
        top = rel.split("/", 1)[0]
        if top in tops and rel not in expected and "__pycache__" not in rel.split("/"):
            problems.append(
                f"{dist}: {rel} ({node.kind}, layer {node.layer + 1}) is under {top} but not in the fixed wheel"
            )
    return problems


def against_wheel(dist: Installed, wheel_rows: tuple[Row, ...], wheel_dist_info: str, what: str) -> list[str]:
    """The installed RECORD against the RECORD of the wheel it was installed from: every row of the wheel's with its
    hash and size (`.data/scripts` aside: rewritten), and nothing else but what an installer adds."""
    problems = []
    installed_rows = {posixpath.normpath(row.path): row for row in dist.rows}
    expected: set[str] = set()
    for row in wheel_rows:
        target = _installed_path(row.path)
        if row.path == f"{wheel_dist_info}/RECORD" or not target or "__pycache__" in target.split("/"):
            continue  # a wheel's own .pyc files may be left out, as the layout installs no .pyc
        expected.add(posixpath.normpath(target))
        if target.startswith("../../../bin/"):
            continue
        mine = installed_rows.get(posixpath.normpath(target))
        if mine is None or (mine.hash, mine.size) != (row.hash, row.size):
            problems.append(
                f"{dist}: {target} is {_describe(mine)} in the installed RECORD, {what}'s RECORD says "
                f"{row.size} bytes {row.hash}"
            )
    extra_ok = {f"{wheel_dist_info}/{name}" for name in INSTALLER_FILES}
    for path in sorted(installed_rows):
        if path in expected or path in extra_ok:
            continue
        if path.startswith("../../../bin/") and posixpath.basename(path) in dist.scripts:
            continue
        if path.startswith("../../../include/") and any("/headers/" in r.path for r in wheel_rows):
            continue  # `.data/headers`, installed where pip puts them
        problems.append(f"{dist}: the installed RECORD lists {path}, which {what} does not have")
    return problems


def wheel_record(path: Path) -> tuple[str, tuple[Row, ...]]:
    """(dist-info directory, RECORD rows) of a wheel file."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = wheelzip.dist_info(archive)
            return info, parse_record(archive.read(f"{info}/RECORD").decode())
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise Failed(f"{path}: not a readable wheel ({exc})") from None


def wheel_record_as_is(path: Path) -> tuple[str, tuple[Row, ...], list[str]]:
    """A locked wheel's RECORD with every row whose size is not its member's replaced by the member's own hash
    and size (what pip installs and writes), and the paths so corrected: the upstream's RECORD is wrong there."""
    info, rows = wheel_record(path)
    corrected: list[str] = []
    fixed_rows = []
    with zipfile.ZipFile(path) as archive:
        sizes = {member.filename: member.file_size for member in archive.infolist()}
        for row in rows:
            size = sizes.get(row.path)
            if size is not None and row.hash and row.size != size:
                row = Row(row.path, wheelzip.record_hash(archive.read(row.path)), size)
                corrected.append(row.path)
            fixed_rows.append(row)
    return info, tuple(fixed_rows), corrected


def _describe(row: Row | None) -> str:
    return "missing" if row is None else f"{row.size} bytes {row.hash or '(no hash)'}"


def _scripts(nodes: dict[str, Node], dists: list[Installed]) -> list[str]:
    """Every declared console script is in the venv's bin, and every script there that names a Python runs ours."""
    problems = []
    declared = {name: dist for dist in dists for name in dist.scripts}
    for name, dist in sorted(declared.items()):
        if f"{BIN}/{name}" not in nodes:
            problems.append(f"{dist}: console script {name} is not in {BIN}")
    for path, node in sorted(nodes.items()):
        data = node.data or b""
        if not path.startswith(f"{BIN}/") or node.kind != "file" or not data.startswith(b"#!"):
            continue
        line = data.split(b"\n", 1)[0][2:].strip().decode(errors="replace")
        interpreter = line.split()[0] if line else ""
        if interpreter != PYTHON and ("python" in line or posixpath.basename(path) in declared):
            owner = declared.get(posixpath.basename(path))
            problems.append(f"{owner or 'no distribution'}: {path} runs {line or '(nothing)'}, not {PYTHON}")
    return problems


def _interpreter(files: ImageFiles) -> list[str]:
    """The venv's python is a link to an ELF interpreter of this platform's CPU in the image."""
    node = files.resolve(PYTHON)
    if node is None or node.kind != "file":
        return [f"{PYTHON} does not lead to an interpreter in the image"]
    machine = elf_machine(node.data or b"")
    if machine != files.platform.e_machine:
        return [
            f"{PYTHON} leads to {node.path}, ELF e_machine {machine}, not {files.platform.e_machine} "
            f"({files.platform.machine}) as {files.platform} needs"
        ]
    return []

"""The patch series: `NNNN-slug.patch` files, their headers, DEP-3 trailers and what each one touches. Each file
section keeps its raw header lines and each hunk its raw lines, so the patch file is read once: whatever needs a part
of a patch as text (status tries single hunks) takes it from here.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path, PurePosixPath

from carry.util.digest import sha256
from carry.util.errors import BadInput
from carry.util.record import field, record

PATCH_NAME_RE = re.compile(r"^(\d{4})-[A-Za-z0-9][A-Za-z0-9._+-]*\.patch$")
PROVED_NAME = "PROVED.json"  # what `prove` learned: which patch makes which test pass (carry/gputest/learned.py)
ALLOWED_EXTRA_FILES = ("DROPPED.md", "README.md", PROVED_NAME, "resolutions")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
TRAILER_KEYS = ("upstream-status", "forwarded", "carry-test")  # DEP-3 and carry's own, any case
SYMLINK_MODE = "120000"
GIT_DIFF_RE = re.compile(r'^diff --git ("(?:[^"\\]|\\.)+"|\S+) ("(?:[^"\\]|\\.)+"|\S+)$')
C_ESCAPES = {b"a": b"\a", b"b": b"\b", b"t": b"\t", b"n": b"\n", b"v": b"\v", b"f": b"\f", b"r": b"\r"}


class UpstreamState(enum.Enum):
    """DEP-3 / Yocto `Upstream-Status` values."""

    PENDING = "Pending"
    SUBMITTED = "Submitted"
    ACCEPTED = "Accepted"
    BACKPORT = "Backport"
    DENIED = "Denied"
    INAPPROPRIATE = "Inappropriate"

    @classmethod
    def parse(cls, text: str, where: str) -> tuple[UpstreamState, str]:
        word, _, rest = text.partition(" ")
        for state in cls:
            if state.value.lower() == word.lower():
                return state, rest.strip().strip("[]").strip()
        allowed = " | ".join(s.value for s in cls)
        raise BadInput(f"{where}: Upstream-Status {text!r} is not one of {allowed}; fix the trailer")


@record
class UpstreamStatus:
    """The trailer's state, its detail without DEP-3's brackets (`local tweak`), and the value as written
    (`Inappropriate [local tweak]`), which is what str() gives."""

    state: UpstreamState
    detail: str
    text: str = ""

    def __str__(self) -> str:
        return self.text or f"{self.state.value} {self.detail}".strip()


@record
class Hunk:
    """One hunk of a file diff: its header and the old/new lines (without the leading marker), and its raw lines
    as the patch has them (the header, the body, `\\ No newline` markers), which are form, not compared."""

    header: str
    old_start: int
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    raw: tuple[str, ...] = field(default=(), compare=False, repr=False)


@record
class FileDiff:
    """One file's change; `header` holds its raw header lines (`diff --git`, `index`, `---`, `+++`, ...), form only
    like the index line in it, so not compared."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    header: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def path(self) -> str:
        name = self.new_path or self.old_path
        assert name is not None  # _parse_file_diff refuses a diff that names no file
        return name

    def text(self, hunks: tuple[int, ...] | None = None, target: str | None = None) -> str:
        """This file's diff with only `hunks` (default all), its path moved to `target` (upstream renamed it)."""
        header = self.header
        if target and self.old_path == self.new_path and target != self.old_path:
            header = tuple(_retarget(line, target) for line in header)
        chosen = range(len(self.hunks)) if hunks is None else hunks
        return "\n".join([*header, *(line for i in chosen for line in self.hunks[i].raw)]) + "\n"


def _retarget(line: str, target: str) -> str:
    if line.startswith("diff --git "):
        return f"diff --git a/{target} b/{target}"
    if line.startswith("--- a/"):
        return f"--- a/{target}"
    if line.startswith("+++ b/"):
        return f"+++ b/{target}"
    return line


@record
class Patch:
    number: int
    name: str
    path: Path
    subject: str
    author: str | None
    date: str | None
    description: str
    upstream_status: UpstreamStatus | None
    forwarded: str | None
    sha256: str
    diffs: tuple[FileDiff, ...]
    tests: tuple[str, ...] = ()  # `Carry-Test:` trailers: the commands that show this patch's fix, as written

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(d.path for d in self.diffs)

    @property
    def added(self) -> int:
        return sum(len(h.added) for d in self.diffs for h in d.hunks)

    @property
    def removed(self) -> int:
        return sum(len(h.removed) for d in self.diffs for h in d.hunks)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "files": list(self.files),
            "added": self.added,
            "removed": self.removed,
            "upstream_status": str(self.upstream_status) if self.upstream_status else None,
            "tests": list(self.tests),
        }


@record
class Series:
    directory: Path
    patches: tuple[Patch, ...]

    @property
    def hash(self) -> str:
        """sha256 over the ordered per-patch sha256 digests."""
        return sha256("\n".join(p.sha256 for p in self.patches).encode()).hexdigest()

    def find(self, name: str) -> Patch:
        for patch in self.patches:
            if name in (patch.name, patch.name.removesuffix(".patch"), f"{patch.number:04d}"):
                return patch
        names = ", ".join(p.name for p in self.patches) or "none"
        raise BadInput(f"no patch named {name!r} in {self.directory}; the series has: {names}")


def load(directory: Path) -> Series:
    """Read every patch in `directory`, ordered by number."""
    if not directory.is_dir():
        raise BadInput(f"{directory}: patches directory not found; create it or set patches.dir in build.yaml")
    patches = []
    seen: dict[int, str] = {}
    for entry in sorted(directory.iterdir()):
        if entry.name in ALLOWED_EXTRA_FILES:
            continue
        match = PATCH_NAME_RE.match(entry.name)
        if not match or not entry.is_file() or entry.is_symlink():
            raise BadInput(
                f"{entry}: not a patch; the patches directory holds only NNNN-slug.patch files "
                f"(and {', '.join(ALLOWED_EXTRA_FILES)}): move it out"
            )
        number = int(match.group(1))
        if number in seen:
            raise BadInput(f"{entry}: duplicate patch number {number:04d} (also {seen[number]}); renumber one")
        seen[number] = entry.name
        patches.append(parse_patch(entry, number))
    patches.sort(key=lambda p: p.number)
    return Series(directory, tuple(patches))


def parse_patch(path: Path, number: int) -> Patch:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text; binary patches are not supported") from None
    lines = text.split("\n")
    diff_start = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), None)
    if diff_start is None:
        diff_start = next((i for i, line in enumerate(lines) if line.startswith("--- ")), None)
    if diff_start is None:
        raise BadInput(f"{path}: empty patch (no diff in it); remove the file or regenerate it")
    headers, description = _parse_message(lines[:diff_start])
    status, forwarded, tests = _trailers(description, path)
    diffs = _parse_diffs(lines[diff_start:], path)
    return Patch(
        number=number,
        name=path.name,
        path=path,
        subject=headers.get("subject") or path.stem.split("-", 1)[1].replace("-", " "),
        author=headers.get("from"),
        date=headers.get("date"),
        description=description,
        upstream_status=status,
        forwarded=forwarded,
        sha256=sha256(data).hexdigest(),
        diffs=diffs,
        tests=tests,
    )


def _parse_message(lines: list[str]) -> tuple[dict[str, str], str]:
    """Split a format-patch message into its mail headers and the description above `---`."""
    headers: dict[str, str] = {}
    index = 1 if lines and re.match(r"^From [0-9a-f]{40} ", lines[0]) else 0
    key = None
    while index < len(lines):
        line = lines[index]
        header = re.match(r"^([A-Za-z-]+): ?(.*)$", line)
        if line.startswith((" ", "\t")) and key:
            headers[key] += " " + line.strip()
        elif header and index < len(lines):
            key = header.group(1).lower()
            headers[key] = header.group(2)
        else:
            break
        index += 1
    if not {"from", "subject"} <= headers.keys():
        return {}, "\n".join(lines).strip()
    for key in ("subject", "from"):
        if "=?" in headers[key]:  # RFC 2047 encoded words (a non-ASCII name or subject)
            import email.header

            headers[key] = str(email.header.make_header(email.header.decode_header(headers[key])))
    headers["subject"] = re.sub(r"^\[PATCH[^\]]*\]\s*", "", headers["subject"])
    body = lines[index:]
    if "---" in body:
        body = body[: body.index("---")]
    return headers, "\n".join(body).strip()


def _trailers(description: str, path: Path) -> tuple[UpstreamStatus | None, str | None, tuple[str, ...]]:
    status = forwarded = None
    tests = []
    for line in description.split("\n"):
        key, colon, value = line.partition(":")
        key, value = key.lower(), value.strip()
        if not colon or key not in TRAILER_KEYS:
            continue
        if key == "upstream-status":
            status = UpstreamStatus(*UpstreamState.parse(value, str(path)), value)
        elif key == "carry-test":
            tests.append(_test_trailer(value, path))
        else:
            forwarded = value
            if not (forwarded in ("no", "not-needed") or re.match(r"^\S+://\S+$", forwarded)):
                raise BadInput(f"{path}: Forwarded {forwarded!r} must be a URL, 'no' or 'not-needed'")
    return status, forwarded, tuple(tests)


def _test_trailer(text: str, path: Path) -> str:
    """A `Carry-Test:` value: a command split like a shell would (no shell runs it); which build.tests entry it
    names, if any, is settled against the config (carry/gputest/behaviour.py)."""
    import shlex

    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"{path}: Carry-Test {text!r} does not parse ({exc}); close the quote") from None
    if not argv:
        raise BadInput(f"{path}: Carry-Test is empty; name the command that shows the fix, e.g. one of build.tests")
    return text


def _parse_diffs(lines: list[str], path: Path) -> tuple[FileDiff, ...]:
    diffs: list[FileDiff] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("diff --git ") or line.startswith("--- "):
            diff, index = _parse_file_diff(lines, index, path)
            diffs.append(diff)
        elif line.startswith("-- ") or line == "--":
            break
        else:
            index += 1
    if not diffs:
        raise BadInput(f"{path}: empty patch (no file changes); remove the file or regenerate it")
    return tuple(diffs)


def _parse_file_diff(lines: list[str], index: int, path: Path) -> tuple[FileDiff, int]:  # noqa: C901 (one scan of a git diff header; split, the parser state would be scattered)
    old_path = new_path = None
    symlink = False
    start = index
    if lines[index].startswith("diff --git "):
        _reject_crlf(lines[index], path)
        if git_paths := GIT_DIFF_RE.match(lines[index]):
            old_path, new_path = (_diff_path(field, path) for field in git_paths.groups())
        index += 1
    while index < len(lines) and not lines[index].startswith(("@@", "diff --git ")):
        line = lines[index]
        _reject_crlf(line, path)
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise BadInput(f"{path}: binary patch for {new_path or old_path}; binary changes are not supported")
        if line.startswith("--- "):
            old_path = _diff_path(line[4:], path)
        elif line.startswith("+++ "):
            new_path = _diff_path(line[4:], path)
        elif line.startswith(("rename from ", "copy from ")):
            old_path = _check_path(_unquote(line.split(" ", 2)[2]), path)
        elif line.startswith(("rename to ", "copy to ")):
            new_path = _check_path(_unquote(line.split(" ", 2)[2]), path)
        elif line.startswith(("new file mode ", "new mode ")) and line.endswith(SYMLINK_MODE):
            symlink = True
        elif not line.strip() or line.startswith(("-- ", "--\n")):
            break
        index += 1
    for name in (n for n in (old_path, new_path) if n is not None):
        _check_path(name, path)
    file_name = new_path or old_path
    if file_name is None:
        raise BadInput(f"{path}: a file diff names no file (or /dev/null on both sides); regenerate the patch")
    header = tuple(lines[start:index])
    hunks = []
    while index < len(lines) and lines[index].startswith("@@"):
        hunk, index = _parse_hunk(lines, index, path, file_name)
        hunks.append(hunk)
    if symlink and new_path is not None:  # a symlink's target is checked where the diff makes one
        for target in (added for hunk in hunks for added in hunk.added):
            _check_symlink_target(new_path, target, path)
    return FileDiff(old_path, new_path, tuple(hunks), header), index


def _parse_hunk(lines: list[str], index: int, path: Path, name: str) -> tuple[Hunk, int]:
    start = index
    header = lines[index]
    _reject_crlf(header, path)
    match = HUNK_RE.match(header)
    if not match:
        raise BadInput(f"{path}: malformed hunk header {header!r} in {name}; regenerate the patch")
    old_start = int(match.group(1))
    old_count = int(match.group(2) or 1)
    new_count = int(match.group(4) or 1)
    old, new, added, removed = list[str](), list[str](), list[str](), list[str]()
    index += 1
    while (len(old) < old_count or len(new) < new_count) and index < len(lines):
        line = lines[index]
        marker, body = line[:1], line[1:]
        if marker == " " or line == "":
            old.append(body)
            new.append(body)
        elif marker == "-":
            old.append(body)
            removed.append(body)
        elif marker == "+":
            new.append(body)
            added.append(body)
        elif marker != "\\":
            break
        index += 1
    if index < len(lines) and lines[index].startswith("\\"):
        index += 1
    if len(old) != old_count or len(new) != new_count:
        raise BadInput(
            f"{path}: truncated hunk {header.strip()} in {name} (expected {old_count}/{new_count} lines, "
            f"found {len(old)}/{len(new)}); regenerate the patch"
        )
    raw = tuple(lines[start:index])
    return Hunk(header.strip(), old_start, tuple(old), tuple(new), tuple(added), tuple(removed), raw), index


def _diff_path(field: str, path: Path) -> str | None:
    field = _unquote(field.split("\t", 1)[0].strip())
    if field == "/dev/null":
        return None
    if field.startswith(("a/", "b/")):
        field = field[2:]
    return _check_path(field, path)


def _unquote(field: str) -> str:
    """A path as git wrote it: in double quotes with C escapes (octal bytes) when it holds unusual characters."""
    if len(field) < 2 or not (field.startswith('"') and field.endswith('"')):
        return field

    def unescape(match: re.Match) -> bytes:
        code = match.group(1)
        return bytes([int(code, 8) & 0xFF]) if code[0] in b"01234567" else C_ESCAPES.get(code, code)

    return re.sub(rb"\\([0-7]{1,3}|.)", unescape, field[1:-1].encode()).decode(errors="surrogateescape")


def _check_path(name: str, path: Path) -> str:
    """A touched path must stay inside the tree and out of `.git`."""
    if name.startswith("/"):
        raise BadInput(f"{path}: absolute path {name!r} in the patch; paths must be relative to the tree")
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise BadInput(f"{path}: path {name!r} leaves the tree; a patch may only touch files inside it")
    if any(part.lower() == ".git" for part in parts):
        raise BadInput(f"{path}: path {name!r} is inside .git; a patch may not touch git's metadata")
    return name


def _check_symlink_target(name: str, target: str, path: Path) -> None:
    resolved = PurePosixPath(name).parent / target
    depth = 0
    for part in resolved.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            break
    if target.startswith("/") or depth < 0:
        raise BadInput(f"{path}: symlink {name} -> {target} points outside the tree; a patch may not do that")


def _reject_crlf(line: str, path: Path) -> None:
    if line.endswith("\r"):
        raise BadInput(f"{path}: CRLF line endings in the patch headers (mangled by an editor); run dos2unix on it")

"""Is a hunk's intent in a file: the lines it adds present where it targets, the lines it removes gone.

Lines are compared as tokens (whitespace, line breaks, quote style, trailing commas and comments do not matter),
in the window where the hunk's post-image lines up with the file, against the same window on the pinned base.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import re
from pathlib import PurePosixPath

from carry.source.series import FileDiff, Hunk

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
COMMENT_LINE_RE = re.compile(r"^\s*(#(\s|$)|//|/\*)")
HASH_COMMENTS = frozenset({".py", ".pyi", ".sh", ".bash", ".cmake", ".toml", ".yaml", ".yml", ".cfg", ".txt"})
SLASH_COMMENTS = frozenset({".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".cu", ".cuh", ".rs", ".go", ".js", ".ts"})
CLOSERS = frozenset(")]}")
SEP = "\x1f"
NEWLINE = "\n"
MIN_SLACK = 6
EDITED_RATIO = 0.6
MEAN_RATIO = 0.8
RARE_LINE = 12


@dataclasses.dataclass(frozen=True)
class Found:
    present: bool
    detail: str
    difference: str = ""


@dataclasses.dataclass(frozen=True)
class Lexer:
    """Splits lines of one file into comparable tokens; knows the file's trailing-comment marker, if any."""

    comment: str | None

    @classmethod
    def for_path(cls, path: str) -> Lexer:
        suffix = PurePosixPath(path).suffix.lower()
        return cls("#" if suffix in HASH_COMMENTS else "//" if suffix in SLASH_COMMENTS else None)

    def tokens(self, line: str) -> list[str]:
        """The line's code tokens (words, single punctuation), quotes unified, a trailing comment cut."""
        return ["'" if t == '"' else t for t in TOKEN_RE.findall(self._code(line))]

    def key(self, line: str) -> tuple[str, ...]:
        """The tokens without a comma before a closing bracket or at the end: what a formatter adds or drops."""
        found = self.tokens(line)
        last = len(found) - 1
        return tuple(t for i, t in enumerate(found) if not (t == "," and (i == last or found[i + 1] in CLOSERS)))

    def _code(self, line: str) -> str:
        if not self.comment:
            return line
        quote, index = None, 0
        while index < len(line):
            char = line[index]
            if quote and char == "\\":
                index += 1
            elif quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif line.startswith(self.comment, index) and (index == 0 or line[index - 1].isspace()):
                return line[:index]
            index += 1
        return line


def has_words(line: str) -> bool:
    return any(t[0].isalnum() or t[0] == "_" for t in TOKEN_RE.findall(line))


def is_code(line: str) -> bool:
    """A line worth looking for: it has a word and is not a comment."""
    return has_words(line) and not COMMENT_LINE_RE.match(line)


class Stream:
    """A region of lines as tokens with the line breaks kept as markers, so a line split over several (or given a
    trailing comma) still counts as that line, and a prefix of a longer line does not."""

    def __init__(self, lines: list[str], lexer: Lexer):
        self.lexer = lexer
        stream = [t for line in lines for t in (*lexer.tokens(line), NEWLINE)]
        kept = [t for i, t in enumerate(stream) if not (t == "," and _next_token(stream, i) in CLOSERS)]
        self.text = NEWLINE + "".join(t if t == NEWLINE else t + SEP for t in kept)

    def count(self, line: str) -> int:
        wanted = self.lexer.key(line)
        if not wanted:
            return 0
        inner = f"{SEP}{NEWLINE}*".join(re.escape(t) for t in wanted)
        return len(re.findall(f"(?<={NEWLINE}){inner}{SEP}(?:,{SEP})?(?={NEWLINE})", self.text))


def _next_token(tokens: list[str], index: int) -> str | None:
    return next((t for t in tokens[index + 1 :] if t != NEWLINE), None)


def locate(lines: tuple[str, ...], ref: list[str], expected: int, slack: int, lexer: Lexer) -> int | None:
    """The REF line where `lines` line up best (most lines matched within `slack`, then nearest `expected`)."""
    where = collections.defaultdict(list)
    for position, line in enumerate(ref):
        if has_words(line):
            where[lexer.key(line)].append(position)
    hits = [(i, p) for i, line in enumerate(lines) if has_words(line) for p in where.get(lexer.key(line), ())]
    rare = [(i, p) for i, p in hits if len(where[lexer.key(lines[i])]) <= RARE_LINE]
    hits = rare or hits

    def rank(start: int) -> tuple[int, int]:
        return -len({i for i, p in hits if abs(p - i - start) <= slack}), abs(start - expected)

    return min(sorted({p - i for i, p in hits}), key=rank, default=None)


def _window(lines: list[str], start: int, length: int, slack: int) -> list[str]:
    return lines[max(0, start - slack) : start + length + slack]


def find(
    hunk: Hunk, new_start: int, pre: list[str] | None, post: list[str] | None, ref: list[str], where: str, lexer: Lexer
) -> Found:
    """Whether `ref` (the file in REF, named `where`) holds the hunk's intent, and what differs; `pre` and `post`,
    the file before and after the patch on the base, are None when unknown (the hunk's own lines stand in)."""
    slack = max(MIN_SLACK, len(hunk.new_lines))
    start = locate(hunk.new_lines, ref, new_start - 1, slack, lexer)
    if start is None:
        return Found(False, f"none of the hunk's lines is in {where}")
    region = _window(ref, start, len(hunk.new_lines), slack)
    if pre is None or post is None:
        pre, post = list(hunk.old_lines), list(hunk.new_lines)
    else:
        pre = _window(pre, hunk.old_start - 1, len(hunk.old_lines), slack)
        post = _window(post, new_start - 1, len(hunk.new_lines), slack)
    before, after, now = Stream(pre, lexer), Stream(post, lexer), Stream(region, lexer)
    added = list(dict.fromkeys(line for line in hunk.added if is_code(line)))
    removed = [line for line in dict.fromkeys(hunk.removed) if is_code(line) and after.count(line) < before.count(line)]
    if not added and not removed:
        return Found(False, "the hunk adds and removes no code line to look for")
    old_keys = {lexer.key(line) for line in pre}
    exact = [line for line in added if now.count(line) >= max(1, after.count(line))]
    edited = {line: _closest(line, region, old_keys, lexer) for line in added if line not in exact}
    missing = [line for line, (ratio, _) in edited.items() if ratio < EDITED_RATIO]
    still = [line for line in removed if now.count(line) > after.count(line)]
    mean = (len(exact) + sum(ratio for ratio, _ in edited.values())) / len(added) if added else 1.0
    present = not missing and not still and (not added or (bool(exact) and mean >= MEAN_RATIO))
    line_no = start + 1
    if not present:
        return Found(False, _absent(where, line_no, added, exact, missing, still, mean))
    parts = [_found(where, line_no, added, exact)]
    for line, (ratio, text) in edited.items():
        parts.append(f"edited upstream: {line.strip()!r} -> {text!r} ({ratio:.0%} alike)")
    if removed:
        parts.append(f"{len(removed)} removed line(s) gone")
    return Found(True, "; ".join(parts), _difference(hunk, region, where, lexer))


def _closest(line: str, region: list[str], old_keys: set, lexer: Lexer) -> tuple[float, str]:
    """The most similar line upstream added to the region (not one that was there before), with its ratio."""
    mine = lexer.key(line)
    best = (0.0, "")
    for other in region:
        theirs = lexer.key(other)
        if theirs and theirs not in old_keys:
            ratio = difflib.SequenceMatcher(None, mine, theirs, autojunk=False).ratio()
            if ratio > best[0]:
                best = (ratio, other.strip())
    return best


def _found(where: str, line_no: int, added: list[str], exact: list[str]) -> str:
    if not added:
        return f"looked in {where} near line {line_no}"
    return f"{len(exact)}/{len(added)} added line(s) found in {where} near line {line_no}"


def _absent(
    where: str, line_no: int, added: list[str], exact: list[str], missing: list[str], still: list[str], mean: float
) -> str:
    parts = [_found(where, line_no, added, exact)]
    if missing:
        parts.append("missing: " + ", ".join(repr(line.strip()) for line in missing[:3]))
    elif exact != added:
        parts.append(f"the rest only {mean:.0%} alike: too far from the patch to call it merged")
    if still:
        parts.append("still there though removed: " + ", ".join(repr(line.strip()) for line in still[:3]))
    return "; ".join(parts)


def _difference(hunk: Hunk, region: list[str], where: str, lexer: Lexer) -> str:
    """A unified diff from the hunk's post-image to the lines of REF it lines up with; REF's side runs from the first
    to the last aligned line with words, so code upstream has around the hunk is not shown as added."""
    words = [i for i, line in enumerate(hunk.new_lines) if has_words(line)]
    if not words:
        return ""
    ours = list(hunk.new_lines[words[0] : words[-1] + 1])
    matcher = difflib.SequenceMatcher(
        None, [_align_key(line, lexer) for line in ours], [_align_key(line, lexer) for line in region], autojunk=False
    )
    aligned = [b.b + k for b in matcher.get_matching_blocks() for k in range(b.size) if has_words(region[b.b + k])]
    if not aligned:
        return ""
    theirs = region[aligned[0] : aligned[-1] + 1]
    if ours == theirs:
        return ""
    return "\n".join(difflib.unified_diff(ours, theirs, "patch post-image", where, lineterm=""))


def _align_key(line: str, lexer: Lexer) -> tuple:
    """What two lines must share to be aligned: their code tokens, else (comments, blanks) their text."""
    key = lexer.key(line) if has_words(line) else ()
    return ("code", *key) if key else ("text", line.strip())


def renamed(diff: FileDiff, target: str | None) -> Found:
    """A change without hunks (a rename): present when REF has the new path."""
    if target is not None and target == diff.new_path:
        return Found(True, f"{diff.new_path} exists in REF")
    return Found(False, f"{diff.new_path} is not in REF")


def deleted(diff: FileDiff, target: str | None) -> Found:
    if target is None:
        return Found(True, f"{diff.old_path} is gone from REF too")
    return Found(False, f"{target} still exists in REF")

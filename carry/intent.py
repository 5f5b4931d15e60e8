"""Is a hunk's intent in a file: the lines it adds present where it targets, the lines it removes gone.

Lines are compared as token streams, so whitespace, line breaks, quote style and trailing commas do not matter.
The place a hunk targets is found by lining its post-image up with the file; the counts there are compared
with the same window of the pre- and post-image on the pinned base, so a line that was already nearby does
not count as added.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import re

from carry.series import FileDiff, Hunk

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
COMMENT_RE = re.compile(r"^\s*(#(\s|$)|//|/\*)")
CLOSERS = frozenset(")]}")
SEP = "\x1f"
MIN_SLACK = 6
EDITED_RATIO = 0.6
RARE_LINE = 12


@dataclasses.dataclass(frozen=True)
class Found:
    present: bool
    detail: str
    difference: str = ""


def key(line: str) -> tuple[str, ...]:
    """A line's tokens, quotes unified and a comma before a closing bracket (or at the end) dropped."""
    return _normalize(["'" if t == '"' else t for t in TOKEN_RE.findall(line)])


def _normalize(tokens: list[str]) -> tuple[str, ...]:
    kept = [t for i, t in enumerate(tokens) if not (t == "," and (i + 1 == len(tokens) or tokens[i + 1] in CLOSERS))]
    return tuple(kept)


def has_words(line: str) -> bool:
    return any(t[0].isalnum() or t[0] == "_" for t in TOKEN_RE.findall(line))


def is_code(line: str) -> bool:
    """A line worth looking for: it has a word and is not a comment."""
    return has_words(line) and not COMMENT_RE.match(line)


class Stream:
    """A region of lines as one token stream; a line still counts when split or joined differently."""

    def __init__(self, lines: list[str]):
        tokens = [t for line in lines for t in key(line)]
        self.text = SEP + SEP.join(_normalize(tokens)) + SEP

    def count(self, line: str) -> int:
        needle = SEP + SEP.join(key(line)) + SEP
        found, at = 0, self.text.find(needle)
        while at >= 0:
            found += 1
            at = self.text.find(needle, at + 1)
        return found


def locate(lines: tuple[str, ...], ref: list[str], expected: int, slack: int) -> int | None:
    """The REF line where `lines` line up best (most lines matched within `slack`, then nearest `expected`)."""
    where = collections.defaultdict(list)
    for position, line in enumerate(ref):
        if has_words(line):
            where[key(line)].append(position)
    hits = [(i, p) for i, line in enumerate(lines) if has_words(line) for p in where.get(key(line), ())]
    rare = [(i, p) for i, p in hits if len(where[key(lines[i])]) <= RARE_LINE]
    hits = rare or hits
    best, best_rank = None, None
    for start in sorted({p - i for i, p in hits}):
        score = len({i for i, p in hits if abs(p - i - start) <= slack})
        rank = (-score, abs(start - expected))
        if best_rank is None or rank < best_rank:
            best, best_rank = start, rank
    return best


def _window(lines: list[str], start: int, length: int, slack: int) -> list[str]:
    return lines[max(0, start - slack): start + length + slack]


def find(hunk: Hunk, new_start: int, pre: list[str] | None, post: list[str] | None, ref: list[str], where: str) -> Found:
    """Whether `ref` (the file in REF, named `where`) holds the hunk's intent, and the difference left."""
    slack = max(MIN_SLACK, len(hunk.new_lines))
    start = locate(hunk.new_lines, ref, new_start - 1, slack)
    if start is None:
        return Found(False, f"none of the hunk's lines is in {where}")
    region = _window(ref, start, len(hunk.new_lines), slack)
    if pre is None or post is None:
        pre, post = list(hunk.old_lines), list(hunk.new_lines)
    else:
        pre = _window(pre, hunk.old_start - 1, len(hunk.old_lines), slack)
        post = _window(post, new_start - 1, len(hunk.new_lines), slack)
    before, after, now = Stream(pre), Stream(post), Stream(region)
    added = list(dict.fromkeys(line for line in hunk.added if is_code(line)))
    removed = [
        line for line in dict.fromkeys(hunk.removed) if is_code(line) and after.count(line) < before.count(line)
    ]
    if not added and not removed:
        return Found(False, "the hunk adds and removes no code line to look for")
    old_keys = {key(line) for line in pre}
    exact = [line for line in added if now.count(line) >= after.count(line)]
    edited = {line: _closest(line, region, old_keys) for line in added if line not in exact}
    missing = [line for line, (ratio, _) in edited.items() if ratio < EDITED_RATIO]
    still = [line for line in removed if now.count(line) > after.count(line)]
    present = not missing and not still and 2 * len(exact) >= len(added)
    line_no = start + 1
    if not present:
        return Found(False, _absent(where, line_no, added, exact, missing, still, edited))
    parts = [f"{len(exact)}/{len(added)} added line(s) found in {where} near line {line_no}"]
    parts += [f"edited upstream: {line.strip()!r} -> {edited[line][1]!r}" for line in edited]
    if removed:
        parts.append(f"{len(removed)} removed line(s) gone")
    return Found(True, "; ".join(parts), _difference(hunk, region, edited, where))


def _closest(line: str, region: list[str], old_keys: set) -> tuple[float, str]:
    """The most similar line upstream added to the region (not one that was there before), with its ratio."""
    mine = key(line)
    best = (0.0, "")
    for other in region:
        theirs = key(other)
        if theirs and theirs not in old_keys:
            ratio = difflib.SequenceMatcher(None, mine, theirs, autojunk=False).ratio()
            if ratio > best[0]:
                best = (ratio, other.strip())
    return best


def _absent(where, line_no, added, exact, missing, still, edited) -> str:
    parts = [f"{len(exact)}/{len(added)} added line(s) found in {where} near line {line_no}"]
    if missing:
        parts.append("missing: " + ", ".join(repr(line.strip()) for line in missing[:3]))
    if edited and not missing:
        parts.append(f"{len(edited)} of them only similar, too many to call it merged")
    if still:
        parts.append("still there though removed: " + ", ".join(repr(line.strip()) for line in still[:3]))
    return "; ".join(parts)


def _difference(hunk: Hunk, region: list[str], edited: dict, where: str) -> str:
    """A unified diff from the hunk's post-image to the lines of REF it lines up with."""
    wanted = {key(line) for line in hunk.new_lines if has_words(line)}
    wanted |= {key(text) for _, text in edited.values()}
    matched = [i for i, line in enumerate(region) if has_words(line) and key(line) in wanted]
    if not matched:
        return ""
    theirs = region[matched[0]: matched[-1] + 1]
    words = [i for i, line in enumerate(hunk.new_lines) if has_words(line)]
    ours = list(hunk.new_lines[words[0]: words[-1] + 1])
    if ours == theirs:
        return ""
    lines = difflib.unified_diff(ours, theirs, "patch post-image", where, lineterm="")
    return "\n".join(lines)


def renamed(diff: FileDiff, target: str | None) -> Found:
    """A change without hunks (a rename): present when REF has the new path."""
    if target is not None and target == diff.new_path:
        return Found(True, f"{diff.new_path} exists in REF")
    return Found(False, f"{diff.new_path} is not in REF")


def deleted(diff: FileDiff, target: str | None) -> Found:
    if target is None:
        return Found(True, f"{diff.old_path} is gone from REF too")
    return Found(False, f"{target} still exists in REF")

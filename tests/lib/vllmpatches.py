"""Patches on the real vLLM 0.33.0 history for the locked image's tests and bench/freshrunner.py: each made with git
on v0.33.0 in a scratch clone, as a maintainer would make it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import realvllm

HEADER = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: carry tests <tests@carry>\n"


def diff(history: Path, change: Callable[[Path], None]) -> str:
    """`git diff` of what `change(checkout)` does to v0.33.0 (staged, so a new file is in it too)."""
    scratch = Path(tempfile.mkdtemp(prefix="carry-patchwork-"))
    try:
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(history), str(scratch / "t")], check=True)
        subprocess.run(["git", "-C", str(scratch / "t"), "checkout", "-q", realvllm.V0_33_0], check=True)
        change(scratch / "t")
        subprocess.run(["git", "-C", str(scratch / "t"), "add", "-A"], check=True)
        return subprocess.run(
            ["git", "-C", str(scratch / "t"), "diff", "--cached"], capture_output=True, text=True, check=True
        ).stdout
    finally:
        shutil.rmtree(scratch)


def message(subject: str) -> str:
    return HEADER + f"Subject: [PATCH] {subject}\n\nUpstream-Status: Inappropriate [test]\n---\n"


def adding_a_line(history: Path, path: str, subject: str) -> str:
    """A patch adding a comment line to `path` (Python only)."""

    def change(tree: Path) -> None:
        target = tree / path
        target.write_text(target.read_text() + "# carried by carry\n")

    return message(subject) + diff(history, change)


def edited(history: Path, patch: Path) -> str:
    """`patch` edited in place: its own change plus a comment line at the end of the first file it changes; its
    message as it was."""
    text = patch.read_text()
    header = text.partition("diff --git ")[0]
    target = text.split("diff --git a/", 1)[1].split(" ", 1)[0]

    def change(tree: Path) -> None:
        subprocess.run(["git", "-C", str(tree), "apply", str(patch)], check=True)
        path = tree / target
        path.write_text(path.read_text() + "# carried by carry: the fix, refined\n")

    return header + diff(history, change)


MODULE = "vllm/carry_probe.py"


def adding_a_module(history: Path) -> str:
    """A patch that adds a Python module (MODULE) to a package vLLM's wheel ships."""

    def change(tree: Path) -> None:
        (tree / MODULE).write_text('"""Carried by carry: a module a patch adds."""\n\nPROBE = 1\n')

    return message("vllm: add carry_probe") + diff(history, change)

"""Every `build.py …` or `carry …` command line in README.md and docs/ parses against the real click CLI (command,
subcommand, flags, arguments: tests/test_workflows.py's checker), so the documentation cannot name a flag that
does not exist; every relative link points at a file that exists; README stays a short start."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from test_workflows import build_py_invocations, cli_problems

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "ci" / "README.md"]
FENCE = re.compile(r"^\s*(?:```|~~~)\s*(\w*)")
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}  # a fence without a language (a layout, a sample output) is text
INLINE = re.compile(r"`([^`]+)`")
# `carry` where a command starts: the line's start, after a shell separator, or inside $( ).
CARRY_COMMAND = re.compile(r"(^|[;&|(]\s*|\$\(\s*)carry(?=\s)")
STARTS_A_COMMAND = re.compile(r"^(?:(?:python3?\s+)?(?:\./)?build\.py|carry)\s+\S")
PLACEHOLDER = re.compile(r"<[^<>]*>")


def as_build_py(text: str) -> str:
    """Shell text with `carry …` commands written as `build.py …` (the same CLI), placeholders as one word."""
    return CARRY_COMMAND.sub(r"\1build.py", PLACEHOLDER.sub("PLACEHOLDER", text))


def command_lines(path: Path) -> list[tuple[str, list[str]]]:
    return commands_in(path.read_text(), str(path.relative_to(ROOT)))


def commands_in(text: str, name: str) -> list[tuple[str, list[str]]]:
    """(name:line, argv after build.py/carry) for each command in markdown `text`: in shell code blocks, indented
    code blocks, and inline code that starts with one."""
    found = []
    fence: str | None = None  # the open fence's language
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{number}"
        opened = FENCE.match(line)
        if opened:
            fence = opened.group(1) if fence is None else None
            continue
        stripped = line.strip()
        if fence is not None and fence not in SHELL_BLOCKS:
            continue
        if fence is not None or (line.startswith("    ") and STARTS_A_COMMAND.match(stripped)):
            if stripped.startswith("$ "):
                stripped = stripped[2:]
            found += [(where, argv) for argv in build_py_invocations(as_build_py(stripped))]
            continue
        for span in INLINE.findall(line):
            span = span.strip()
            if STARTS_A_COMMAND.match(span) and "…" not in span and "..." not in span:
                found += [(where, argv) for argv in build_py_invocations(as_build_py(span))]
    return found


COMMANDS = [entry for path in DOCUMENTS for entry in command_lines(path)]


def test_the_documents_hold_commands_to_check():
    assert len(COMMANDS) >= 25, COMMANDS
    assert {path.name for path in DOCUMENTS} >= {"README.md", "commands.md", "architecture.md", "testing.md"}


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[f"{where} {shlex.join(argv)}" for where, argv in COMMANDS])
def test_documented_command_parses_against_the_cli(where, argv):
    problems = cli_problems(argv)
    if len(argv) == 1:  # `build.py drop` in prose names the command: it must exist, its arguments are elsewhere
        problems = [problem for problem in problems if "missing argument" not in problem]
    assert not problems, f"{where}: build.py {shlex.join(argv)}: {problems[0]}"


def test_the_checker_finds_a_made_up_flag_and_names_the_line():
    text = (
        "# x\n\n```bash\ncarry check --no-such-flag\n```\n\nand `build.py wheel --out dist` and `carry` alone\n"
        "```\nbuild.py   the CLI (a layout, not a command)\n```\n\n    python build.py status --against <a ref>\n"
    )
    found = commands_in(text, "docs/made-up.md")
    assert found == [
        ("docs/made-up.md:4", ["check", "--no-such-flag"]),
        ("docs/made-up.md:7", ["wheel", "--out", "dist"]),
        ("docs/made-up.md:12", ["status", "--against", "PLACEHOLDER"]),
    ]
    assert cli_problems(found[0][1]) == ["build.py check: no option --no-such-flag; it has: --against, --json"]
    assert not cli_problems(found[1][1]) and not cli_problems(found[2][1])


def test_readme_is_a_short_start_that_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    assert "```bash\nbash ci/setup.sh && bash examples/demo/run.sh\n```" in text
    assert "```bash\npython -m pytest -q\n```" in text
    steps = [
        step
        for step in ("carry check", "carry wheel", "carry verify", "carry image --push", "carry status", "carry drop")
        if step in text
    ]
    assert len(steps) == 6, steps


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(path):
    for target in LINK.findall(path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{path.relative_to(ROOT)}: link to {target}, which does not exist"

"""carry's command line: the click group (`--config`), `main` with its exit codes, and COMMANDS, what `--help`
lists without importing any command; each command's module in carry/cli/commands/ is imported only when it runs.
"""

from __future__ import annotations

import gc
import importlib
import sys
from gettext import gettext

import click

from carry.util.errors import CarryError

# name -> (module in carry.cli.commands, attribute, short help: the first sentence of the command's docstring, what
# `--help` lists; tests/test_cli.py checks it against the commands themselves)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "cache": (
        "cache",
        "cache_command",
        "Show the size of each part of carry's cache ($CARRY_CACHE): mirrors, bundles, build dirs, environments, "
        "wheels, downloads, wheelhouses, logs, and the rest; hardlinked files counted once.",
    ),
    "check": (
        "check",
        "check",
        "Apply the series in order onto the pinned base (or REF) in a private index; exit 1 if any fails.",
    ),
    "drop": (
        "verdicts",
        "drop_command",
        "Remove a patch REF needs no more (MERGED-*, DELETED-UPSTREAM, PR-ONLY, FIXED-UPSTREAM), move the pin to "
        "the commit that merged it (with upstream.pr: the PR head, which must hold it), carry the rest of the series "
        "over there, bump VERSION once and log it in patches/DROPPED.md; on a conflict nothing changes (exit 1).",
    ),
    "fetch": (
        "fetch",
        "fetch",
        "Fetch the pinned commit (and the PR head) into the cache mirror; print the base commit.",
    ),
    "follow": (
        "verdicts",
        "follow_command",
        "Take the project from its pin to upstream REF (default: upstream.follow) on the branch carry/follow/REF, one "
        "commit per step: drop what REF merged, carry the rest over (replaying recorded resolutions), move the pins, "
        "the lock and VERSION, build, compare the upstream's suite and prove; exit 1 when a human is needed (a "
        "conflict, a regression), with the branch as far as it got; nothing changes on the current branch.",
    ),
    "gate": (
        "gate",
        "gate_command",
        "Gate any wheel (upstream's own releases too: no buildinfo needed), unpacked tree or .so files: which GPUs "
        "can run each shared object, by build.yaml's gate policy when --config exists, else the strict rule (every "
        "arch by cubin), and the CPU of every .so.",
    ),
    "image": (
        "image",
        "image_command",
        "Build the image with BuildKit, one build per platform (the build stage runs `build.py wheel`), tag it from "
        "VERSION, label it with its provenance, and optionally push; with several platforms each is tagged "
        "VERSION-ARCH and, on push, every shared tag becomes a manifest list of them all.",
    ),
    "keygen": (
        "keygen",
        "keygen_command",
        "Write a new ECDSA P-256 signing key pair: DIRECTORY/carry.key (PKCS#8 PEM, mode 0600, encrypted with "
        "$CARRY_SIGNING_KEY_PASSWORD when it is set) and DIRECTORY/carry.pub (the public key verify --key and "
        "cosign verify --key take).",
    ),
    "lock": (
        "lock",
        "lock_command",
        "Resolve the fixed wheel's Requires-Dist with uv into pinned, sha256-hashed wheels for each platform's "
        "runtime base image (its Python and glibc, read from the image), through your configured index; write it "
        "beside build.yaml (image.lock).",
    ),
    "manifest": (
        "image",
        "manifest_command",
        "Make every shared tag (VERSION, the templates, --tag) a manifest list of the platforms' VERSION-ARCH "
        "images, which separate runs (one per platform) pushed; checked against the registry afterwards.",
    ),
    "pin": (
        "pin",
        "pin_command",
        "Find each platform's precompiled wheel on build.precompiled.nightly's per-commit index: the merge-base C "
        "of upstream.commit and main, else the nearest commit back along main whose compiled inputs are the patched "
        "tree's (max_walk); download and hash it (trust on first use: the index gives no hashes), prove its commit "
        "from its version, and write build.precompiled.wheels in place.",
    ),
    "prove": (
        "gputest",
        "prove_command",
        "Build the wheel of every prefix of the series (base, base+0001 and on; cached like every build), run "
        "build.tests on each on this GPU, and print which patch flips which test from FAIL to PASS.",
    ),
    "refresh": (
        "verdicts",
        "refresh",
        "Rebase the series onto a new upstream base (3-way merge, following upstream's renames), move the pin, "
        "rewrite the patches that moved and bump VERSION (when anything changed); on a conflict change nothing and "
        "exit 1, naming `drop` for the patches REF needs no more.",
    ),
    "status": (
        "verdicts",
        "status",
        "One verdict per patch against newer upstream refs, each with its evidence: MERGED-EXACT, MERGED-MODIFIED, "
        "PARTIAL, CONFLICT, NEEDED; DELETED-UPSTREAM or PR-ONLY when the patched file is gone from REF (upstream "
        "deleted it, or only the PR has it); FIXED-UPSTREAM (--test) when the patch's test passes on REF without it.",
    ),
    "suite": (
        "suite",
        "suite_command",
        "Run the upstream's own test suite (build.upstream_tests: paths, marker, deselections, timeout) on the fixed "
        "wheel and on the wheel it was made from, each in an environment of its own, no network, no GPU, and compare "
        "per test id: regressed (passed before, fails now), fixed, failed both (the upstream's own), only one side; "
        "write the report beside the wheel (<wheel>.suite.json).",
    ),
    "test": (
        "gputest",
        "test_command",
        "Run build.tests against a wheel (installed into a fresh venv) or an image (docker run --gpus all) on this "
        "machine's GPU; write the JSON report beside the wheel (<wheel>.test.json).",
    ),
    "verify": (
        "verify",
        "verify",
        "Verify a wheel file, an image reference or a test report against this repo (VERSION, series hash, pinned "
        "commit).",
    ),
    "version": ("version", "version", "Print VERSION (YYYYMMDD.N)."),
    "wheel": (
        "wheel",
        "wheel_command",
        "Build the patched tree into a wheel for the CUDA arches (or, with build.precompiled, take the compiled code "
        "from the upstream's own wheel, proven to match the source), gate it, check it holds exactly the patched "
        "tree, stamp provenance; reuse when unchanged.",
    ),
}


# The commands whose start tests/test_spine.py holds to what they use: they print no phase line, and install no
# reporter (the process's default would answer)
LOADS_LITTLE = frozenset({"check", "version"})


class LazyGroup(click.Group):
    """A group whose commands live in carry.cli.commands.<module>, imported when one is looked up to run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attribute, _ = entry
        command = getattr(importlib.import_module(f"carry.cli.commands.{module}"), attribute)
        assert isinstance(command, click.Command), f"carry.cli.commands.{module}.{attribute}"
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their short help, as click lists them, from COMMANDS: no command module imported."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=short).get_short_help_str(limit)) for name, (*_, short) in COMMANDS.items()
        ]
        with formatter.section(gettext("Commands")):
            formatter.write_dl(sorted(rows))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),  # a str: pathlib (and cli.common) load only once a command runs, not for --help
    default="build.yaml",
    show_default=True,
    help="The build.yaml to use; VERSION and patches/ are found relative to it.",
)
@click.pass_context
def cli(ctx: click.Context, config_path: str) -> None:
    """carry: fetch an upstream PR at a pinned commit, prove the patch series applies in order,
    and build a versioned wheel and container image from the patched tree.

    The cache (mirrors, bundles, build dirs, artifacts, logs) lives in $CARRY_CACHE
    (default ~/.cache/carry).
    """
    from pathlib import Path

    from carry.cli.common import Context

    ctx.obj = Context(Path(config_path))
    if ctx.invoked_subcommand not in LOADS_LITTLE:
        from carry.util import reporter  # here: `check` and `version` load nothing more (tests/test_spine.py)

        # the one output channel, for the whole command: its clock starts now (docs/architecture.md)
        ctx.with_resource(reporter.using(reporter.Reporter()))


def main() -> None:
    try:
        cli.main(prog_name="carry", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("carry: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"carry: error: {exc.format_message()}; see --help", err=True)
        sys.exit(2)
    except CarryError as exc:
        click.echo(f"carry: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        from pathlib import Path

        from carry.util import fsutil

        if not fsutil.is_no_space(exc):
            raise
        # A full disk wherever carry writes: one line naming the path (the destination of a copy) and what is free.
        full = exc.filename2 or exc.filename
        click.echo(f"carry: error: {fsutil.no_space_line(Path(full)) if full else exc}", err=True)
        sys.exit(1)
    finally:
        # The garbage collection at exit walks every object still alive (~10 ms for `check`, as much as carry's own
        # work) and skips frozen ones; atexit handlers and module teardown still run.
        gc.freeze()

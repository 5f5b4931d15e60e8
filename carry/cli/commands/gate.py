"""`gate`: which GPUs (and which CPU) can run any wheel, tree or .so files."""

from __future__ import annotations

import json
import sys

import click

from carry.cli.common import Context, parse_platform


@click.command("gate")
@click.argument("targets", nargs=-1, required=True, metavar="WHEEL|DIR|SO...")
@click.option(
    "--arch",
    metavar="LIST",
    help="Gate for these CUDA arches (default: build.cuda_arches of --config, "
    "or the platform's own from image.platforms).",
)
@click.option(
    "--platform",
    metavar="P",
    help="The CPU every .so must be code for, e.g. linux/arm64 (default: the "
    "wheel's platform tag; not checked for a tree or .so files without it).",
)
@click.option("--strict", is_flag=True, help="Ignore build.gate's rules: every shared object must run on every arch.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def gate_command(
    obj: Context, targets: tuple[str, ...], arch: str | None, platform: str | None, strict: bool, as_json: bool
) -> None:
    """Gate any wheel (upstream's own releases too: no buildinfo needed), unpacked tree or .so files: which GPUs
    can run each shared object, by build.yaml's gate policy when --config exists, else the strict rule (every
    arch by cubin), and the CPU of every .so. Prints the coverage table (in full on failure). Exit 0 when it
    passes, 1 when it does not."""
    from carry.app.gate import GateRequest, gate

    asked = GateRequest(
        config_path=obj.config_path, targets=targets, arch=arch, platform=parse_platform(platform), strict=strict
    )
    report = gate(asked)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo("\n".join(report.lines() if report.ok else report.full_lines()))
    sys.exit(0 if report.ok else 1)

"""`gate`: which GPUs (and which CPU) can run any wheel, tree or .so files, by build.yaml's policy if there is one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from carry import config
from carry.arch import given
from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    from carry.binaries.gate import GateReport
    from carry.platforms import Platform


@record(kw_only=True)
class GateRequest:
    config_path: Path
    targets: tuple[str, ...]
    arch: str | None = None
    platform: Platform | None = None
    strict: bool = False


def gate(request: GateRequest) -> GateReport:
    """Gate a wheel, an unpacked tree or `.so` files, upstream's own releases included: by build.yaml's policy (its
    arches, or --arch) where there is a config, else the strict rule; each `.so`'s CPU against --platform or the tag."""
    from carry.binaries import gate as gating
    from carry.binaries import gatepolicy
    from carry.binaries import sharedobjects as binaries
    from carry.platforms import Platform

    config_path = request.config_path
    loaded = config.load(config_path) if config_path.exists() else None
    objects, tag = binaries.read(request.targets)
    found_platform = request.platform or (Platform.from_wheel_tag(tag) if tag else None)
    arches = given(request.arch)
    if arches is None and loaded is not None:
        arches = loaded.arches_for(found_platform)
    if arches is None:
        where = f"{config_path} has no build.cuda_arches" if loaded else f"no config at {config_path}"
        raise BadInput(f"{where}: pass --arch LIST (e.g. --arch 12.1,10.0,9.0) to say which GPUs to gate for")
    policy = (
        gatepolicy.for_config(loaded, arches)
        if loaded is not None and not request.strict
        else gatepolicy.GatePolicy(arches)
    )
    return gating.check(objects, policy, found_platform)

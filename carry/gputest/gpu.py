"""The GPU this machine has, as nvidia-smi reports it; `test` and `prove` need one."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

from carry.util.errors import BadInput
from carry.util.run import execute

QUERY = ("name", "compute_cap", "driver_version")
NO_GPU_HINT = "run it on a machine with an NVIDIA GPU and its driver (e.g. a GPU CI runner)"


@dataclasses.dataclass(frozen=True)
class Gpu:
    """The first GPU: its name, compute capability ('9.0'), driver version, and how many GPUs there are."""

    name: str
    capability: str
    driver: str
    count: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        more = f" (+{self.count - 1} more)" if self.count > 1 else ""
        return f"{self.name} ({self.capability}), driver {self.driver}{more}"


def probe() -> Gpu | None:
    """The GPU nvidia-smi answers for, or None where there is no nvidia-smi, no driver or no device."""
    if (smi := shutil.which("nvidia-smi")) is None:
        return None
    try:
        result = execute([smi, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader"], text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[field.strip() for field in line.split(",")] for line in result.stdout.splitlines() if line.strip()]
    rows = [row for row in rows if len(row) == len(QUERY)]
    if result.returncode != 0 or not rows:
        return None
    name, capability, driver = rows[0]
    return Gpu(name, capability, driver, len(rows))


# What a report records where no GPU was needed and none answered.
NONE = Gpu("no GPU (none needed)", "none", "none", 0)


def require(command: str, tests: tuple = ()) -> Gpu:
    """The GPU, or bad input (exit 2, one line) when there is none; when `tests` are given and none of them needs a
    GPU (build.tests entries with `gpu: false`), NONE stands in where no GPU answers."""
    found = probe()
    if found is None and tests and not any(test.gpu for test in tests):
        return NONE
    if found is None:
        raise BadInput(f"`{command}` needs a CUDA GPU and {missing()}; {NO_GPU_HINT}")
    return found


def missing() -> str:
    """Why no GPU answers, in a few words."""
    return "nvidia-smi is not on PATH" if shutil.which("nvidia-smi") is None else "nvidia-smi finds no GPU"

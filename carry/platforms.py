"""Container platforms (`linux/arm64`, ...): parsed once into a `Platform`, with the facts carry needs about
its CPU, and whether this machine can run its programs (natively, or through a binfmt_misc emulator)."""

from __future__ import annotations

import enum
import os
import struct
from pathlib import Path

from carry.util.errors import BadInput

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
ELF_MAGIC = b"\x7fELF"


class Platform(enum.Enum):
    """An OCI platform carry builds for: (os/arch[/variant], `uname -m`, ELF e_machine, ELF class, big-endian)."""

    LINUX_AMD64 = ("linux/amd64", "x86_64", 62, 64, False)
    LINUX_ARM64 = ("linux/arm64", "aarch64", 183, 64, False)
    LINUX_ARM_V7 = ("linux/arm/v7", "armv7l", 40, 32, False)
    LINUX_PPC64LE = ("linux/ppc64le", "ppc64le", 21, 64, False)
    LINUX_S390X = ("linux/s390x", "s390x", 22, 64, True)
    LINUX_RISCV64 = ("linux/riscv64", "riscv64", 243, 64, False)

    def __str__(self) -> str:
        return self.value[0]

    @property
    def machine(self) -> str:
        """What `uname -m` and Python's `platform.machine()` say on this CPU (also the wheel tag's arch)."""
        return self.value[1]

    @property
    def qemu(self) -> str:
        """The name of QEMU's user-mode emulator for this CPU (`qemu-aarch64`)."""
        return "qemu-" + {"armv7l": "arm"}.get(self.machine, self.machine)

    @property
    def e_machine(self) -> int:
        return self.value[2]

    @property
    def os(self) -> str:
        return str(self).split("/")[0]

    @property
    def architecture(self) -> str:
        return str(self).split("/")[1]

    @property
    def variant(self) -> str | None:
        parts = str(self).split("/")
        return parts[2] if len(parts) > 2 else None

    @property
    def tag(self) -> str:
        """The tag suffix of this platform's own image: `arm64`, `arm-v7`."""
        return str(self).split("/", 1)[1].replace("/", "-")

    @classmethod
    def parse(cls, text: str, where: str) -> Platform:
        """`linux/arm64` (also `linux/aarch64`, `linux/x86_64`, `linux/arm64/v8`); errors list what is allowed."""
        aliases = {
            "linux/aarch64": "linux/arm64",
            "linux/arm64/v8": "linux/arm64",
            "linux/x86_64": "linux/amd64",
            "linux/arm": "linux/arm/v7",
        }
        wanted = aliases.get(text.strip().lower(), text.strip().lower())
        for platform in cls:
            if str(platform) == wanted:
                return platform
        allowed = ", ".join(str(p) for p in cls)
        raise BadInput(f"{where}: unknown platform {text!r}; use one of: {allowed}")

    @classmethod
    def from_machine(cls, machine: str) -> Platform | None:
        machine = {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)
        return next((p for p in cls if p.machine == machine), None)

    @classmethod
    def from_wheel_tag(cls, tag: str) -> Platform | None:
        """The platform of a wheel's platform tag (`linux_aarch64`, `manylinux_2_17_x86_64`); None for `any`."""
        return next((p for p in cls if tag.startswith(("linux_", "manylinux")) and tag.endswith("_" + p.machine)), None)

    @classmethod
    def native(cls) -> Platform:
        """This machine's platform (under emulation, the emulated one)."""
        found = cls.from_machine(os.uname().machine)
        if found is None:
            raise BadInput(f"no container platform is known for this machine's CPU {os.uname().machine!r}")
        return found

    def where(self) -> str:
        """How this machine runs the platform's programs, for progress lines: "" or " (emulated on linux/amd64)"."""
        native = Platform.native()
        return "" if self is native else f" (emulated on {native})"

    def elf_header(self) -> bytes:
        """The first 20 bytes of an executable for this CPU, as binfmt_misc matches them."""
        order = ">" if self.value[4] else "<"
        ident = ELF_MAGIC + bytes([2 if self.value[3] == 64 else 1, 2 if self.value[4] else 1, 1]) + bytes(9)
        return ident + struct.pack(f"{order}HH", 2, self.e_machine)


def machine_name(e_machine: int | None) -> str:
    found = next((p for p in Platform if p.e_machine == e_machine), None)
    return found.machine if found else f"e_machine {e_machine}"


class Emulation:
    """This machine's binfmt_misc handlers: which platforms' programs the kernel hands to an emulator."""

    def __init__(self, directory: Path = BINFMT_DIR):
        self.directory = directory

    def handler(self, platform: Platform) -> tuple[str, bool] | None:
        """(name, has the F flag) of an enabled handler that matches the platform's ELF header, else None."""
        header = platform.elf_header()
        for entry in sorted(self.directory.glob("*")) if self.directory.is_dir() else []:
            fields = None if entry.name in ("register", "status") else _read_handler(entry)
            if fields is not None and fields.get("enabled") and _matches(header, fields):
                return entry.name, "F" in fields.get("flags", "")
        return None

    def require(self, platform: Platform) -> None:
        """Pass when `platform` is native or emulated in a way containers can use; else bad input naming the fix."""
        native = Platform.native()
        if platform is native:
            return
        found = self.handler(platform)
        fix = (
            f"install and enable QEMU (Debian: apt-get install qemu-user-static binfmt-support, then "
            f"update-binfmts --enable {platform.qemu}), or build on a {platform} machine"
        )
        if found is None:
            raise BadInput(
                f"this {native} machine cannot run {platform} programs (no enabled binfmt_misc handler "
                f"for {platform.machine} in {self.directory}); {fix}"
            )
        name, fix_binary = found
        if not fix_binary:
            raise BadInput(
                f"the binfmt_misc handler {name} for {platform} lacks the F flag, so containers cannot "
                f"use it; re-register it with the F flag (qemu-user-static does), or build on a "
                f"{platform} machine"
            )


def _read_handler(entry: Path) -> dict | None:
    try:
        lines = entry.read_text().splitlines()
    except OSError:
        return None
    fields: dict = {"enabled": bool(lines) and lines[0].strip() == "enabled"}
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        fields[key.rstrip(":")] = value.strip()
    return fields


def _matches(header: bytes, fields: dict) -> bool:
    """binfmt_misc's own test: the masked bytes at the offset equal the masked magic."""
    try:
        offset = int(fields.get("offset", "0"))
        magic = bytes.fromhex(fields["magic"])
        mask = bytes.fromhex(fields["mask"]) if fields.get("mask") else b"\xff" * len(magic)
    except (KeyError, ValueError):
        return False
    window = header[offset : offset + len(magic)]
    if len(window) < len(magic):
        return False
    return all((w & m) == (g & m) for w, g, m in zip(window, magic, mask))

"""The CUDA toolkit a runtime lock ships: when the lock holds NVIDIA's pip nvcc, the wheels that make the image's
CUDA_HOME must be one CUDA release, torch's. Otherwise a JIT that compiles with it (FlashInfer's, at vLLM's first
request) stops at CCCL's "CUDA compiler and CUDA toolkit headers are incompatible" (an unpinned nvcc resolves to the
newest release beside torch's older runtime).

    the lock's pins -> mismatch() (None: one release) -> constraints() for uv -> the lock resolved again

NVIDIA's wheels put libcudart.so.13 alone in CUDA_HOME/lib, where FlashInfer links `-L$CUDA_HOME/lib64
-L$CUDA_HOME/lib64/stubs -lcudart -lcuda` (flashinfer#5064): `layout` adds a toolkit's lib64 -> lib, the runtime's
development link and the driver's link-time stub (libcuda.so.1; at run time the container's driver is loaded)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
import struct
from collections.abc import Mapping
from pathlib import Path

from carry.platforms import Platform

COMPILER = "nvidia-cuda-nvcc"  # a lock without it ships no compiler: nothing to agree
ANCHOR = "nvidia-cuda-runtime"  # what torch's CUDA is (cuda-toolkit's pin)
# What makes CUDA_HOME for nvcc: bin/nvcc (nvcc), crt/ and cudafe (crt), cicc and libdevice (nvvm), the CCCL headers
# (cccl), cuda_runtime.h and libcudart (runtime).
COMPONENTS = (COMPILER, "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl", ANCHOR)
SUFFIX_RE = re.compile(r"-cu\d+$")  # CUDA 12's wheels: nvidia-cuda-nvcc-cu12, ...


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Toolkit components of another release than torch's runtime: the runtime's release and version, and the
    others as (name, version)."""

    release: str  # "13.0"
    anchor: tuple[str, str]  # ("nvidia-cuda-runtime", "13.0.96")
    others: tuple[tuple[str, str], ...]

    def line(self) -> str:
        named = ", ".join(f"{name} {version}" for name, version in self.others)
        return (
            f"its CUDA toolkit is not one release: {self.anchor[0]} {self.anchor[1]} (torch's CUDA {self.release}) "
            f"but {named}; a JIT compiling with this CUDA_HOME fails (CCCL: compiler and toolkit headers "
            f"incompatible)"
        )


def release(version: str) -> str:
    """The CUDA release of a component's version: its first two numbers ("13.5.37" -> "13.5")."""
    return ".".join(version.split(".")[:2])


def components(pins: Mapping[str, str]) -> dict[str, str]:
    """The toolkit's wheels among `pins` (canonical name -> version), by name as pinned."""
    return {name: version for name, version in pins.items() if SUFFIX_RE.sub("", name) in COMPONENTS}


def mismatch(pins: Mapping[str, str]) -> Mismatch | None:
    """None when the lock ships no nvcc, or every toolkit wheel is of the runtime's release; else what differs."""
    found = components(pins)
    anchor = next(((n, v) for n, v in found.items() if SUFFIX_RE.sub("", n) == ANCHOR), None)
    if anchor is None or not any(SUFFIX_RE.sub("", n) == COMPILER for n in found):
        return None
    wanted = release(anchor[1])
    others = tuple(sorted((n, v) for n, v in found.items() if release(v) != wanted))
    return Mismatch(wanted, anchor, others) if others else None


def constraints(pins: Mapping[str, str], found: Mismatch) -> list[str]:
    """uv constraints holding every toolkit wheel of the lock to the runtime's release."""
    return [f"{name}=={found.release}.*" for name in sorted(components(pins))]


DECLARED_RE = re.compile(rb"\bCUDAAPI\s+(cu[A-Z]\w*)\s*\(")
DEFINED_RE = re.compile(rb"^\s*#\s*define\s+cu[A-Z]\w*\s+(__CUDA_API_PT(DS|SZ)\()?(cu[A-Z]\w*)", re.M)


def home_of(pins: Mapping[str, str]) -> str | None:
    """CUDA_HOME under site-packages (`nvidia/cu13`) when the lock ships NVIDIA's pip nvcc and runtime of CUDA 13 or
    later (one directory; CUDA 12's wheels spread the toolkit over several), else None."""
    major = (pins.get(ANCHOR) or "").split(".")[0]
    if COMPILER not in pins or not major.isdigit() or int(major) < 13:
        return None
    return f"nvidia/cu{major}"


@dataclasses.dataclass(frozen=True)
class Added:
    """A path carry adds to CUDA_HOME (no leading '/'): a symlink to `link`, or a file of `data`."""

    path: str
    link: str = ""
    data: bytes = b""


def layout(site: str, pins: Mapping[str, str], platform: Platform, cuda_h: bytes) -> list[Added]:
    """What makes the lock's CUDA_HOME a toolkit's layout for a JIT's link, paths under `site` (empty without such a
    CUDA_HOME); `cuda_h`: the runtime wheel's cuda.h, whose driver API the stub defines."""
    home = home_of(pins)
    if home is None:
        return []
    root = f"{site.strip('/')}/{home}".lstrip("/")
    return [
        Added(f"{root}/lib64", link="lib"),
        Added(f"{root}/lib/libcudart.so", link=f"libcudart.so.{home.removeprefix('nvidia/cu')}"),
        Added(f"{root}/lib/stubs/libcuda.so", data=driver_stub(platform, driver_api(cuda_h))),
    ]


def code_digest() -> str:
    """sha256 of this module, which makes `layout`'s bytes from the lock's wheels: in the nvidia layer's key
    (layerplan.group_key), so that a layer another carry made (another stub) is never reused from a cache or a
    registry (`verify IMAGE` remakes the stub and finds such a layer wrong)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def driver_api(cuda_h: bytes) -> tuple[str, ...]:
    """The driver's symbols cuda.h makes code reference: each declared function, each name a `#define` versions it
    to (cuMemAlloc -> cuMemAlloc_v2), and their per-thread-stream forms (_ptds, _ptsz)."""
    names = {m.group(1).decode() for m in DECLARED_RE.finditer(cuda_h)}
    for match in DEFINED_RE.finditer(cuda_h):
        target = match.group(3).decode()
        names.add(target)
        if match.group(2):
            names.add(f"{target}_pt{match.group(2).decode().lower()}")
    return tuple(sorted(names))


def driver_stub(platform: Platform, symbols: tuple[str, ...], soname: str = "libcuda.so.1") -> bytes:
    """A 64-bit little-endian ELF shared object named `soname` that defines `symbols` (as the toolkit's
    stubs/libcuda.so does): what `-lcuda` links against, so that the linked object needs libcuda.so.1, the driver
    the container runtime provides. Only linked against, never loaded: its code is 4 zero bytes."""
    dynstr, where = b"\0" + soname.encode() + b"\0", []
    for name in symbols:
        where.append(len(dynstr))
        dynstr += name.encode() + b"\0"
    count = len(symbols) + 1  # and the null symbol
    names = (".hash", ".dynsym", ".dynstr", ".text", ".dynamic", ".shstrtab")
    shstr = b"\0" + b"\0".join(n.encode() for n in names) + b"\0"
    sizes = (4 * (3 + count), 24 * count, len(dynstr), 4, 16 * 7, len(shstr))
    at = list(itertools.accumulate((size + -size % 8 for size in sizes), initial=64 + 2 * 56))
    hash_, dynsym, _, text, dynamic = at[:5]
    data = [
        struct.pack(f"<{3 + count}I", 1, count, int(bool(symbols)), *range(1, count), 0),  # one bucket, one chain
        bytes(24) + b"".join(struct.pack("<IBBHQQ", w, 0x12, 0, 4, text, 0) for w in where),  # GLOBAL FUNC in .text
        dynstr,
        bytes(4),
        b"".join(
            struct.pack("<qQ", tag, value)  # SONAME, HASH, STRTAB, SYMTAB, STRSZ, SYMENT, NULL
            for tag, value in ((14, 1), (4, hash_), (5, at[2]), (6, dynsym), (10, len(dynstr)), (11, 24), (0, 0))
        ),
        shstr,
    ]
    shoff = at[6]
    end = shoff + 64 * (len(names) + 1)
    header = struct.pack(
        "<4s5B7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 3, platform.e_machine, 1, 0, 64, shoff, 0, 64, 56, 2, 64,
        len(names) + 1, len(names),
    )  # fmt: skip
    phdrs = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, end, end, 0x10000)  # PT_LOAD R+X, the whole file
    phdrs += struct.pack("<IIQQQQQQ", 2, 6, dynamic, dynamic, dynamic, sizes[4], sizes[4], 8)  # PT_DYNAMIC
    # per section: type, flags (A=2, X=4, W=1), link, info, entsize
    table = ((5, 2, 2, 0, 4), (11, 2, 3, 1, 24), (3, 2, 0, 0, 0), (1, 6, 0, 0, 0), (6, 3, 3, 0, 16), (3, 0, 0, 0, 0))
    sections = bytes(64) + b"".join(
        struct.pack("<IIQQQQIIQQ", shstr.index(b"\0" + n.encode()) + 1, kind, flags, at[k] if flags else 0, at[k],
                    sizes[k], link, info, 8, entsize)
        for k, (n, (kind, flags, link, info, entsize)) in enumerate(zip(names, table))
    )  # fmt: skip
    body = b"".join(piece + bytes(-len(piece) % 8) for piece in data)
    return header + phdrs + body + sections

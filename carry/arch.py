"""CUDA architecture lists: parsed once into an `ArchList`, rendered for PyTorch, CMake and nvcc.

Accepted tokens (separated by commas, semicolons or spaces): ``9.0``, ``12.0f``, ``12.1a``,
``9.0+PTX`` (cubin and PTX), ``sm_121``, ``sm_121a`` (cubin) and ``compute_90`` (PTX only).
``none`` on its own (or an empty list) is the empty list: a wheel with no CUDA code at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from enum import Enum

from carry.util.errors import BadInput
from carry.util.record import record

ALLOWED_FORMS = "X.Y, X.Ya, X.Yf, X.Y+PTX, sm_XY[a|f], compute_XY[a|f], or none alone"
NO_CUDA = "none"

_DOTTED = re.compile(r"(?P<major>\d+)\.(?P<minor>\d)(?P<variant>[af]?)(?P<ptx>\+ptx)?")
_NVCC = re.compile(r"(?P<prefix>sm|compute)_(?P<major>\d+)(?P<minor>\d)(?P<variant>[af]?)")
_SEPARATORS = re.compile(r"[,;\s]+")


class ComputeCapability(Enum):
    """A GPU generation nvcc 13 can target, as (major, minor)."""

    SM_75 = (7, 5)
    SM_80 = (8, 0)
    SM_86 = (8, 6)
    SM_87 = (8, 7)
    SM_88 = (8, 8)
    SM_89 = (8, 9)
    SM_90 = (9, 0)
    SM_100 = (10, 0)
    SM_103 = (10, 3)
    SM_110 = (11, 0)
    SM_120 = (12, 0)
    SM_121 = (12, 1)

    def __init__(self, major: int, minor: int):
        self.major = major
        self.minor = minor

    @property
    def number(self) -> str:
        """The digits nvcc uses: ``121`` for 12.1."""
        return f"{self.major}{self.minor}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @classmethod
    def from_numbers(cls, major: int, minor: int) -> ComputeCapability | None:
        """The capability for (major, minor), or None when nvcc 13 does not know it."""
        return next((cc for cc in cls if cc.value == (major, minor)), None)

    def supports(self, variant: Variant) -> bool:
        """'a' exists from Hopper (9.0) on, 'f' from Blackwell (10.0) on."""
        first = {Variant.PLAIN: (0, 0), Variant.ARCH_SPECIFIC: (9, 0), Variant.FAMILY: (10, 0)}
        return self.value >= first[variant]


class Variant(Enum):
    """How far a target reaches: plain (later minors too), 'a' (its own chip), 'f' (its family)."""

    PLAIN = ""
    ARCH_SPECIFIC = "a"
    FAMILY = "f"


def _bad_token(token: str, reason: str) -> BadInput:
    known = ", ".join(str(cc) for cc in ComputeCapability)
    return BadInput(f"cuda_arches: {token!r} {reason}; use {ALLOWED_FORMS} with X.Y one of {known}")


@record
class CudaTarget:
    """One compute capability and variant, built as a cubin, as PTX, or both."""

    capability: ComputeCapability
    variant: Variant = Variant.PLAIN
    cubin: bool = True
    ptx: bool = False

    @classmethod
    def parse(cls, token: str) -> CudaTarget:
        text = token.strip().lower()
        match = _DOTTED.fullmatch(text) or _NVCC.fullmatch(text)
        if match is None:
            raise _bad_token(token, "is not a CUDA arch")
        parts = match.groupdict()
        capability = ComputeCapability.from_numbers(int(parts["major"]), int(parts["minor"]))
        if capability is None:
            raise _bad_token(token, "is not a compute capability nvcc 13 builds for")
        variant = Variant(parts["variant"])  # the token is lowercased
        if not capability.supports(variant):
            raise _bad_token(token, f"has no '{variant.value}' variant")
        ptx_only = parts.get("prefix") == "compute"
        return cls(capability, variant, cubin=not ptx_only, ptx=ptx_only or bool(parts.get("ptx")))

    @property
    def key(self) -> tuple[ComputeCapability, Variant]:
        return (self.capability, self.variant)

    @property
    def code_name(self) -> str:
        """The nvcc digits with the variant suffix: ``121a``."""
        return self.capability.number + self.variant.value

    def merged(self, other: CudaTarget) -> CudaTarget:
        """This target also building whatever `other` (same capability and variant) builds."""
        return CudaTarget(self.capability, self.variant, self.cubin or other.cubin, self.ptx or other.ptx)

    def __str__(self) -> str:
        return self.torch_spelling() if self.cubin else f"compute_{self.code_name}"

    def torch_spelling(self) -> str:
        """TORCH_CUDA_ARCH_LIST has no PTX-only form: a PTX-only target becomes ``X.Y+PTX``."""
        return f"{self.capability}{self.variant.value}" + ("+PTX" if self.ptx else "")

    def cmake_spellings(self) -> list[str]:
        return [f"{self.code_name}-{kind}" for kind in self._kinds()]

    def gencode_flags(self) -> list[str]:
        arch = f"compute_{self.code_name}"
        code = {"real": f"sm_{self.code_name}", "virtual": arch}
        return [f"-gencode=arch={arch},code={code[kind]}" for kind in self._kinds()]

    def _kinds(self) -> list[str]:
        """What to build in CMake's words: 'real' for a cubin, 'virtual' for PTX."""
        return [kind for kind, wanted in (("real", self.cubin), ("virtual", self.ptx)) if wanted]


@record
class ArchList:
    """The targets to build, deduplicated, in the order first named."""

    targets: tuple[CudaTarget, ...] = ()

    @classmethod
    def parse(cls, value: str | Iterable[str | float]) -> ArchList:
        tokens = list(_tokens(value))
        if any(token.lower() == NO_CUDA for token in tokens):
            if len(tokens) > 1:
                raise _bad_token(NO_CUDA, "means no CUDA code and cannot be combined with arches")
            return cls()
        merged: dict[tuple[ComputeCapability, Variant], CudaTarget] = {}
        for token in tokens:
            target = CudaTarget.parse(token)
            known = merged.get(target.key)
            merged[target.key] = known.merged(target) if known else target
        return cls(tuple(merged.values()))

    @property
    def expects_cuda(self) -> bool:
        """False for the empty list: the wheel must hold no CUDA code (a Python-only build)."""
        return bool(self.targets)

    def __iter__(self) -> Iterator[CudaTarget]:
        return iter(self.targets)

    def __len__(self) -> int:
        return len(self.targets)

    def __str__(self) -> str:
        """The list as carry writes it (buildinfo, labels, --arch): ``9.0,12.1+PTX``, or ``none``."""
        return ",".join(str(target) for target in self.targets) or NO_CUDA

    def torch_cuda_arch_list(self) -> str:
        """``TORCH_CUDA_ARCH_LIST`` for PyTorch extensions and vLLM, e.g. ``9.0 12.0 12.1+PTX``."""
        return " ".join(target.torch_spelling() for target in self.targets)

    def cmake_cuda_architectures(self) -> str:
        """``CMAKE_CUDA_ARCHITECTURES``, e.g. ``90-real;121a-real;120-virtual``."""
        return ";".join(spelling for target in self.targets for spelling in target.cmake_spellings())

    def gencode_flags(self) -> list[str]:
        """nvcc arguments, one ``-gencode=arch=...,code=...`` per cubin or PTX."""
        return [flag for target in self.targets for flag in target.gencode_flags()]


def _tokens(value: str | Iterable[str | float]) -> Iterator[str]:
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise _bad_token(str(item), "is not a string")
        yield from (token for token in _SEPARATORS.split(str(item)) if token)


def given(text: str | None) -> ArchList | None:
    """An --arch option parsed, or None when it was not given; an empty --arch is bad input."""
    if text is not None and not text.strip():
        raise BadInput("--arch is empty; pass arches, e.g. --arch 9.0,12.1, or --arch none for a Python-only wheel")
    return ArchList.parse(text) if text is not None else None

"""The one seam between what is known of a build and the way its wheel is made: `choose` picks the producer of
one platform's wheel (the upstream's build from source, its build with the precompiled code taken from the
upstream's wheel, a derivation of the last such build, the platform's build stage, or this machine's pure-Python
wheel), by one placement rule (`here`). Everything that picks a way to make a wheel asks it: the `wheel` command,
`wheel.Builder` and `wheel.build`, the wheels of a locked image and of `lock`."""

from __future__ import annotations

import dataclasses
import enum
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from carry.util.record import record

if TYPE_CHECKING:
    from carry.platforms import Platform
    from carry.wheelbuild import compilecache

Job = TypeVar("Job", contravariant=True)  # what the producers of one caller are handed (wheel.Job in wheelbuild)


class Kind(enum.Enum):
    SOURCE = "source"  # the upstream's PEP 517 build here, compiling for the arches
    PRECOMPILED = "precompiled"  # the same build here, the compiled code taken from the upstream's proven wheel
    DERIVED = "derived"  # a Python-only change on a precompiled build: its last wheel with the members replaced
    BUILD_STAGE = "build stage"  # the platform's Dockerfile build stage (emulated where the CPU is foreign)
    PURE = "pure Python"  # this machine's wheel, py3-none-any: it installs on every platform


@record(kw_only=True)
class Facts:
    """What is known of one platform's build when a producer is chosen; what is not known yet stays False/None
    (a derivation is known once the plan is; this machine's wheel once it is made)."""

    platform: Platform
    native: Platform
    precompiled: bool = False  # build.precompiled has a wheel for the platform and the build may take it
    derivable: bool = False  # the family's last PEP 517 build can be derived from (derive.plan)
    made_here: str | None = None  # the file name of the wheel this machine made for its own CPU, if one was
    staged: bool = False  # the command names the platform's build stage (`wheel --platform P`), even this CPU's


@dataclasses.dataclass(frozen=True)
class Produced:
    """A wheel a producer made in scratch space, unchecked, with its log and the compiler cache's outcome."""

    wheel: Path
    log: Path
    scratch: Path
    cache: compilecache.CacheOutcome | None = None


class Producer(Protocol[Job]):
    """A way a wheel is made, as `choose` names it: handed the job, it makes the wheel in scratch space, yields it
    while the caller finishes it (gate, tree check, stamp, store), and cleans up after (wheel.PRODUCERS)."""

    def __call__(self, job: Job, /) -> AbstractContextManager[Produced]: ...


def here(facts: Facts) -> bool:
    """The placement rule: made on this machine when its compiled code comes from build.precompiled's wheel (nothing
    compiles: any CPU will do), or when the platform is this machine's and no build stage was asked for."""
    return facts.precompiled or (facts.platform is facts.native and not facts.staged)


def serves_every_platform(name: str) -> bool:
    """Whether a wheel of this file name installs on every platform (pure Python: `py3-none-any`)."""
    return name.endswith("-none-any.whl")


def takes_precompiled(kind: Kind) -> bool:
    """Whether a producer of this kind takes the compiled code from build.precompiled's wheel."""
    return kind in (Kind.PRECOMPILED, Kind.DERIVED)


def choose(facts: Facts) -> Kind:
    """The producer of one platform's wheel: here (derived, precompiled or from source), else this machine's wheel
    where it is pure Python, else the platform's build stage."""
    if here(facts):
        if not facts.precompiled:
            return Kind.SOURCE
        return Kind.DERIVED if facts.derivable else Kind.PRECOMPILED
    if facts.made_here is not None and serves_every_platform(facts.made_here):
        return Kind.PURE
    return Kind.BUILD_STAGE

"""The arch gate's policy: which GPUs a build promises (the arch list), and per shared object which GPUs the
upstream meant it for by design, resolved once from build.yaml into one typed object.

    build:
      cuda_arches: "12.1,10.0,9.0"
      gate:
        - match: vllm/vllm_flash_attn/_vllm_fa3_C.*so   # a glob on the path inside the wheel
          gpus: "9.0a"                                  # what it is built for by design
          why: FA3 is Hopper's ...
          jit: true                                     # PTX compiled at load is accepted for it

A shared object no rule matches must hold a cubin for every requested arch (PTX only where the list asks for it).
For a matched one, a requested GPU outside its `gpus` is reported as not built for it by design, and inside them
the strict rule holds. `gpus` takes the arch-list grammar (`all`, the default, is every GPU); the first match decides.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from carry.arch import ArchList, ComputeCapability, Variant
from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    from carry.config import Config

ALL = "all"
RULE_KEYS = ("match", "gpus", "jit", "why")
STRICT_SOURCE = "strict (no gate rules)"


@record
class GateRule:
    """One shared object's design: the glob naming it, the GPUs it is for (None: all), JIT accepted, and why."""

    match: str
    gpus: frozenset[ComputeCapability] | None
    gpus_text: str
    jit: bool
    why: str

    def matches(self, path: str) -> bool:
        return glob_pattern(self.match).fullmatch(path) is not None

    def covers(self, gpu: ComputeCapability) -> bool:
        return self.gpus is None or gpu in self.gpus

    def describe(self) -> str:
        jit = ", JIT accepted" if self.jit else ""
        gpus = "every GPU" if self.gpus is None else self.gpus_text
        return f"{self.match}: for {gpus}{jit}"

    def to_json(self) -> dict:
        return {"match": self.match, "gpus": self.gpus_text, "jit": self.jit, "why": self.why}


@record
class GatePolicy:
    """The arch list a build promises and the rules for shared objects that exist for some GPUs only."""

    arches: ArchList
    rules: tuple[GateRule, ...] = ()
    source: str = STRICT_SOURCE

    def rule_for(self, path: str) -> GateRule | None:
        return next((rule for rule in self.rules if rule.matches(path)), None)

    def with_arches(self, arches: ArchList) -> GatePolicy:
        return GatePolicy(arches, self.rules, self.source)

    def describe_rules(self) -> str:
        return f"{len(self.rules)} rule(s) from {self.source}" if self.rules else self.source

    def to_json(self) -> dict:
        return {"cuda_arches": str(self.arches), "rules": [r.to_json() for r in self.rules], "source": self.source}

    def digest(self) -> str:
        """What the gate checks, for the wheel cache key (the source's name does not change the verdict)."""
        import hashlib
        import json

        material = {"cuda_arches": str(self.arches), "rules": [rule.to_json() for rule in self.rules]}
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_json(cls, data: dict, where: str) -> GatePolicy:
        """The policy a wheel recorded in its buildinfo (older buildinfo: the arch list alone, strict)."""
        arches = ArchList.parse(str(data.get("cuda_arches", "")))
        rules = parse_rules(data.get("rules") or [], where)
        return cls(arches, rules, str(data.get("source") or where) if rules else STRICT_SOURCE)


def for_config(config: Config, arches: ArchList) -> GatePolicy:
    """The gate's policy for a build of `config` promising `arches`: build.gate's rules, else the strict rule."""
    rules = parse_rules(config.build.gate, f"{config.path}: build.gate")
    return GatePolicy(arches, rules, f"{config.path.name} build.gate") if rules else GatePolicy(arches)


def parse_rules(value: object, where: str) -> tuple[GateRule, ...]:
    """build.gate: a list of {match, gpus, jit, why}; every error names the entry and the form."""
    form = "a list of rules like {match: 'pkg/_ext*.so', gpus: '9.0a,10.0f', jit: false, why: '...'}"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadInput(f"{where} must be {form}, got {value!r}")
    rules = []
    for index, entry in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(entry, dict):
            raise BadInput(f"{at} must be a mapping with match, gpus, jit and why, got {entry!r}")
        unknown = sorted(str(k) for k in entry if k not in RULE_KEYS)
        if unknown:
            raise BadInput(f"{at}: unknown key {unknown[0]!r}; allowed: {', '.join(RULE_KEYS)}")
        match = entry.get("match")
        if not isinstance(match, str) or not match.strip() or match.startswith("/"):
            raise BadInput(
                f"{at}.match must be a glob on the path inside the wheel, e.g. 'pkg/_ext*.so', got {match!r}"
            )
        jit = entry.get("jit", False)
        if not isinstance(jit, bool):
            raise BadInput(f"{at}.jit must be true or false, got {jit!r}")
        why = entry.get("why")
        if not isinstance(why, str) or not why.strip():
            raise BadInput(
                f"{at}.why is required: say why {match} exists for some GPUs only (cite the upstream's build files)"
            )
        gpus, text = _gpus(entry.get("gpus", ALL), f"{at}.gpus")
        if gpus is None and not jit:
            raise BadInput(
                f"{at} changes nothing (gpus all, jit false); give the GPUs {match} is built for, or "
                f"jit: true, or remove the rule"
            )
        rules.append(GateRule(match.strip(), gpus, text, jit, " ".join(why.split())))
    return tuple(rules)


def _gpus(value: object, where: str) -> tuple[frozenset[ComputeCapability] | None, str]:
    if isinstance(value, str) and value.strip().lower() == ALL:
        return None, ALL
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, (str, list)):
        raise BadInput(f"{where} must be '{ALL}' or arches like '9.0a,10.0f', got {value!r}")
    try:
        targets = ArchList.parse(value)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None
    if not targets.expects_cuda:
        raise BadInput(f"{where} is empty; give the GPUs it is built for, e.g. '9.0a', or '{ALL}'")
    covered = frozenset(cc for target in targets for cc in _reach(target.capability, target.variant))
    return covered, str(targets)


def _reach(capability: ComputeCapability, variant: Variant) -> set[ComputeCapability]:
    """The GPUs a build for `capability` in `variant` is meant for: 'f' spans its family's later minors."""
    if variant is not Variant.FAMILY:
        return {capability}
    return {cc for cc in ComputeCapability if cc.major == capability.major and cc.minor >= capability.minor}


def glob_pattern(pattern: str) -> re.Pattern:
    """A path glob: `*` and `?` stay within one path component, `**` crosses them, `[...]` is a set."""
    out, index = [], 0
    while index < len(pattern):
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        char = pattern[index]
        close = pattern.find("]", index + 2) if char == "[" else -1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif close != -1:
            body = pattern[index + 1 : close]
            out.append("[^" + re.escape(body[1:]) + "]" if body.startswith("!") else "[" + re.escape(body) + "]")
            index = close
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out), re.DOTALL)

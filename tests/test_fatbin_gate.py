"""carry.binaries.fatbin and carry.binaries.gate on shared objects built by the real nvcc, checked with cuobjdump."""

import json
import re
import shutil
import struct
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

import cuda_tools
from carry.arch import ArchList, ComputeCapability, Variant
from carry.binaries import fatbin, gate
from carry.binaries import sharedobjects as binaries
from carry.binaries.fatbin import FatbinEntry, Kind
from carry.binaries.gate import NO_CUDA_CODE, UNEXPECTED_CUDA, How, coverage
from carry.binaries.gatepolicy import GatePolicy, parse_rules
from carry.platforms import Platform
from carry.util.errors import BadInput, Failed
from cuda_tools import cuobjdump

CC = ComputeCapability
KERNEL = """
__global__ void scale(float *x, float by) { x[threadIdx.x] *= by; }
extern "C" void launch_scale(float *x, float by) { scale<<<1, 32>>>(x, by); }
"""
# name -> arch list the .so is built for (rendered to nvcc flags by carry.arch itself)
BUILDS = {
    "multi": "sm_90 sm_120 sm_121",
    "a_only": "sm_120a",
    "ptx_only": "compute_90",
    "family": "12.0f compute_120f",
}


def _compile(nvcc: str, source: Path, name: str) -> Path:
    output = source.parent / f"{name}.so"
    flags = ArchList.parse(BUILDS[name]).gencode_flags()
    cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", str(output), str(source), *flags]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return output


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    nvcc = cuda_tools.nvcc()
    directory = tmp_path_factory.mktemp("cuda")
    source = directory / "scale.cu"
    source.write_text(KERNEL)
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = pool.map(lambda name: _compile(nvcc, source, name), BUILDS)
        return dict(zip(BUILDS, outputs))


@pytest.fixture(scope="module")
def cpu_only(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cpu")
    (directory / "add.c").write_text("int add(int a, int b) { return a + b; }\n")
    output = directory / "add.so"
    cmd = ["cc", "-shared", "-fPIC", "-o", str(output), str(directory / "add.c")]
    subprocess.run(cmd, check=True)
    return output


def _names(entries) -> list[str]:
    return [str(entry) for entry in entries]


def _cuobjdump_in_order(path: Path) -> list[str]:
    """`cuobjdump -elf` prints a 'Fatbin elf/ptx code' block per entry with its full arch name."""
    cmd = [cuobjdump(), "-elf", str(path)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    blocks = re.findall(r"^Fatbin (elf|ptx) code:\n=+\narch = sm_(\w+)$", out, flags=re.M)
    return [("sm_" if kind == "elf" else "compute_") + arch for kind, arch in blocks]


def _cuobjdump_listing(path: Path) -> Counter:
    """`cuobjdump --list-elf --list-ptx` names; it drops the 'f' of family cubins."""
    cmd = [cuobjdump(), "--list-elf", "--list-ptx", str(path)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    names = re.findall(r"\.sm_(\w+)\.(cubin|ptx)$", out, flags=re.M)
    return Counter(("sm_" if ext == "cubin" else "compute_") + arch for arch, ext in names)


# --- fatbin.read against cuobjdump ---------------------------------------------------------


@pytest.mark.parametrize("name", list(BUILDS))
def test_read_matches_cuobjdump_entry_by_entry(built, name):
    assert _names(fatbin.read(built[name])) == _cuobjdump_in_order(built[name])


@pytest.mark.parametrize("name", list(BUILDS))
def test_read_matches_cuobjdump_listing(built, name):
    entries = fatbin.read(built[name])
    listed = Counter(
        f"sm_{e.major}{e.minor}" if e.kind is Kind.CUBIN and e.variant is Variant.FAMILY else str(e) for e in entries
    )
    assert listed == _cuobjdump_listing(built[name])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("multi", {"sm_90", "sm_120", "sm_121"}),
        ("a_only", {"sm_120a"}),
        ("ptx_only", {"compute_90"}),
        ("family", {"sm_120f", "compute_120f"}),
    ],
)
def test_read_finds_what_was_built(built, name, expected):
    assert set(_names(fatbin.read(built[name]))) == expected


def test_family_cubin_is_typed(built):
    cubins = [e for e in fatbin.read(built["family"]) if e.kind is Kind.CUBIN]
    assert cubins and all((e.major, e.minor, e.variant) == (12, 0, Variant.FAMILY) for e in cubins)


def test_non_elf_and_cpu_only_files_have_no_entries(tmp_path, cpu_only):
    text = tmp_path / "notes.so"
    text.write_text("not an ELF file\n")
    assert fatbin.read(text) == []
    assert fatbin.read(cpu_only) == []


def _section_offset(path: Path) -> int:
    with open(path, "rb") as stream:
        return ELFFile(stream).get_section_by_name(fatbin.SECTION)["sh_offset"]


@pytest.mark.parametrize(
    ("where", "value"),
    [(0, struct.pack("<I", 0xDEADBEEF)), (8, struct.pack("<Q", 1 << 40))],
    ids=["bad-magic", "payload-past-end"],
)
def test_corrupt_fatbin_fails_naming_the_file(built, tmp_path, where, value):
    broken = tmp_path / "broken.so"
    data = bytearray(built["multi"].read_bytes())
    offset = _section_offset(built["multi"]) + where
    data[offset : offset + len(value)] = value
    broken.write_bytes(bytes(data))
    with pytest.raises(Failed, match=re.escape(str(broken))) as excinfo:
        fatbin.read(broken)
    assert excinfo.value.exit_code == 1


# --- gate rules --------------------------------------------------------------------------------


def _entry(name: str) -> FatbinEntry:
    """A fatbin entry value from its cuobjdump-style name, e.g. 'sm_120f' or 'compute_90'."""
    prefix, digits, variant = re.fullmatch(r"(sm|compute)_(\d+)(\d[af]?)", name).groups()
    kind = Kind.CUBIN if prefix == "sm" else Kind.PTX
    return FatbinEntry(kind, int(digits), int(variant[0]), Variant(variant[1:]))


@pytest.mark.parametrize(
    ("entries", "gpu", "how", "via"),
    [
        (["sm_120"], CC.SM_121, How.COMPATIBLE, "sm_120"),
        (["sm_120a"], CC.SM_121, How.NONE, None),
        (["sm_120a"], CC.SM_120, How.EXACT, "sm_120a"),
        (["sm_121a"], CC.SM_121, How.EXACT, "sm_121a"),
        (["sm_120f"], CC.SM_121, How.FAMILY, "sm_120f"),
        (["sm_120f"], CC.SM_120, How.EXACT, "sm_120f"),
        (["sm_90"], CC.SM_100, How.NONE, None),
        (["sm_100"], CC.SM_90, How.NONE, None),
        (["sm_121"], CC.SM_120, How.NONE, None),
        (["sm_80"], CC.SM_89, How.COMPATIBLE, "sm_80"),
        (["compute_90"], CC.SM_121, How.JIT, "compute_90"),
        (["compute_120"], CC.SM_90, How.NONE, None),
        (["compute_120f"], CC.SM_121, How.JIT, "compute_120f"),
        (["compute_100f"], CC.SM_120, How.NONE, None),
        (["compute_121a"], CC.SM_121, How.JIT, "compute_121a"),
        (["compute_120a"], CC.SM_121, How.NONE, None),
        (["sm_90", "sm_120", "sm_121"], CC.SM_121, How.EXACT, "sm_121"),
        (["sm_80", "sm_86", "compute_89"], CC.SM_89, How.COMPATIBLE, "sm_86"),
        (["compute_90", "sm_120a"], CC.SM_121, How.JIT, "compute_90"),
        ([], CC.SM_121, How.NONE, None),
    ],
)
def test_coverage_rules(entries, gpu, how, via):
    found = coverage([_entry(name) for name in entries], gpu)
    assert found.how is how
    assert (str(found.via) if found.via else None) == via


def test_sm_120_cubin_read_from_a_real_build_covers_12_1(built):
    without_121 = [e for e in fatbin.read(built["multi"]) if e.capability != (12, 1)]
    assert coverage(without_121, CC.SM_121).how is How.COMPATIBLE


# --- the gate and its policy on real builds -----------------------------------------------------


def _gate(paths, arches, rules=None, platform=None):
    policy = GatePolicy(ArchList.parse(arches), parse_rules(rules, "test") if rules else ())
    return gate.check(binaries.from_paths([Path(p) for p in paths]), policy, platform)


def _cells(report, name):
    entry = next(e for e in report.to_json()["files"] if Path(e["path"]).name == name)
    return {target: cell["text"] for target, cell in entry["targets"].items()}


def test_multi_build_passes_its_own_list(built):
    report = _gate([built["multi"]], "9.0,12.0,12.1")
    assert report.ok and report.failures == []
    assert {how["how"] for how in report.to_json()["files"][0]["targets"].values()} == {"exact"}


def test_sm_90_does_not_cover_10_0(built):
    (failure,) = _gate([built["multi"]], "9.0,10.0").failures
    assert str(failure.target) == "10.0"
    assert str(built["multi"]) in failure.message and "10.0" in failure.message


def test_arch_specific_cubin_alone_fails_for_the_next_chip(built):
    assert _gate([built["a_only"]], "12.0").ok
    (failure,) = _gate([built["a_only"]], "12.1").failures
    assert "sm_121" in failure.message and "sm_120a" in failure.message


def test_ptx_only_is_jit_only_unless_the_list_or_a_rule_allows_ptx(built):
    (failure,) = _gate([built["ptx_only"]], "12.1").failures
    assert "JIT" in failure.message and str(built["ptx_only"]) in failure.message
    assert _gate([built["ptx_only"]], "12.1+PTX").ok
    assert _gate([built["ptx_only"]], "compute_121").ok
    assert _gate([built["ptx_only"]], "compute_90").ok
    accepted = _gate([built["ptx_only"]], "12.1", [{"match": "**ptx_only.so", "jit": True, "why": "JIT by design"}])
    assert accepted.ok and _cells(accepted, "ptx_only.so") == {"12.1": "JIT compute_90"}


def test_family_cubin_covers_12_0_and_12_1(built):
    report = _gate([built["family"]], "12.0,12.1")
    assert report.ok
    targets = report.to_json()["files"][0]["targets"]
    assert {k: targets["12.1"][k] for k in ("how", "via", "ok")} == {"how": "family", "via": "sm_120f", "ok": True}


def test_a_rule_scopes_an_object_to_the_gpus_it_is_built_for(built, tmp_path):
    tree = tmp_path / "tree" / "pkg"
    tree.mkdir(parents=True)
    shutil.copy(built["a_only"], tree / "_hopper_C.abi3.so")
    shutil.copy(built["multi"], tree / "_C.abi3.so")
    rule = [{"match": "pkg/_hopper_C.*so", "gpus": "12.0a", "why": "built for its own chip only"}]
    strict = _gate([tmp_path / "tree"], "12.0,12.1")
    assert not strict.ok and _cells(strict, "_hopper_C.abi3.so") == {"12.0": "exact sm_120a", "12.1": "NOTHING !"}
    scoped = _gate([tmp_path / "tree"], "12.0,12.1", rule)
    assert scoped.ok, scoped.lines()
    assert _cells(scoped, "_hopper_C.abi3.so") == {"12.0": "exact sm_120a", "12.1": "by design"}
    assert "12.1: not built for it (by design) [ok]" in [c.describe() for o in scoped.objects for c in o.cells]
    # The rule names one object: the core stays strict, so a core without 12.1 code still fails.
    shutil.copy(built["a_only"], tree / "_C.abi3.so")
    (failure,) = _gate([tmp_path / "tree"], "12.0,12.1", rule).failures
    assert failure.path == "pkg/_C.abi3.so" and str(failure.target) == "12.1"


def test_a_rule_that_matches_nothing_is_reported(built):
    report = _gate([built["multi"]], "12.1", [{"match": "pkg/_gone*.so", "gpus": "9.0", "why": "removed"}])
    assert report.ok
    assert "rule matched no shared object: pkg/_gone*.so: for 9.0" in report.lines()
    assert report.to_json()["unmatched_rules"][0]["match"] == "pkg/_gone*.so"


def test_cpu_only_object_is_reported_not_failed(built, cpu_only, tmp_path):
    wheel = tmp_path / "wheel"
    (wheel / "pkg").mkdir(parents=True)
    shutil.copy(built["multi"], wheel / "pkg" / "_C.abi3.so")
    shutil.copy(cpu_only, wheel / "pkg" / "_cpu.so")
    (wheel / "pkg" / "__init__.py").write_text("")
    report = _gate([wheel], "9.0,12.1")
    assert report.ok
    by_name = {Path(entry["path"]).name: entry for entry in report.to_json()["files"]}
    assert set(by_name) == {"_C.abi3.so", "_cpu.so"}
    assert by_name["_cpu.so"]["cuda"] is False and by_name["_C.abi3.so"]["cuda"] is True
    assert "no CUDA code: _cpu" in report.lines()


def test_the_cpu_of_every_object_is_checked_against_the_platform(built):
    assert _gate([built["multi"]], "12.1", platform=Platform.LINUX_AMD64).ok
    (failure,) = _gate([built["multi"]], "12.1", platform=Platform.LINUX_ARM64).failures
    assert "is x86_64 code (ELF e_machine 62), not aarch64 (183)" in failure.message


def test_no_cuda_code_anywhere_fails_for_a_non_empty_list(cpu_only, tmp_path):
    (failure,) = _gate([cpu_only], "12.1").failures
    assert NO_CUDA_CODE in failure.message and failure.path is None
    (failure,) = _gate([tmp_path], "12.1").failures
    assert NO_CUDA_CODE in failure.message
    assert _gate([cpu_only], "").ok


def test_an_empty_list_expects_no_cuda_code_and_says_so(built, cpu_only, tmp_path):
    none = _gate([cpu_only], "none")
    assert none.ok and none.lines() == [
        "arch gate passed: no CUDA code expected (cuda_arches none), none found in 1 shared object(s)"
    ]
    assert _gate([tmp_path], "none").lines()[0].endswith("none found in the wheel (no shared objects)")
    (failure,) = _gate([cpu_only, built["multi"]], "none").failures
    assert UNEXPECTED_CUDA in failure.message and failure.path == str(built["multi"])
    assert "holds sm_90, sm_120, sm_121" in failure.message and "set build.cuda_arches" in failure.message


def test_the_table_groups_alike_rows_and_fits_80_columns(built, tmp_path):
    tree = tmp_path / "tree" / "pkg"
    tree.mkdir(parents=True)
    for name in ("_one_C", "_two_C"):
        shutil.copy(built["multi"], tree / f"{name}.abi3.so")
    shutil.copy(built["ptx_only"], tree / "_ptx_C.abi3.so")
    report = _gate([tmp_path / "tree"], "12.1+PTX,10.0")
    lines = report.lines()
    assert all(len(line) <= 80 for line in lines[:-3]), lines
    header = lines[2].split()
    assert header == ["12.1+PTX", "10.0"]
    assert any(
        line.startswith("_one_C, _two_C") and line.split()[-4:] == ["exact", "sm_121", "NOTHING", "!"] for line in lines
    ), lines
    assert any(line.startswith("_ptx_C") and "JIT compute_90" in line for line in lines), lines
    full = report.full_lines()
    assert "  pkg/_ptx_C.abi3.so: compute_90" in full
    assert sum(line.startswith("FAIL ") for line in full) == 3


def test_failures_serialize(built):
    report = _gate([built["a_only"], built["ptx_only"]], "12.1")
    assert len(report.failures) == 2 and report.headline().startswith("arch gate FAILED (2 problem(s))")
    document = json.loads(json.dumps(report.to_json()))
    assert document["ok"] is False and document["cuda_arches"] == "12.1"
    assert [f["target"] for f in document["failures"]] == ["12.1", "12.1"]


def test_missing_path_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        binaries.read([tmp_path / "nope.so"])


@pytest.mark.parametrize(
    ("rules", "needle"),
    [
        ("not a list", "must be a list of rules"),
        ([{"match": "x.so", "gpus": "9.0"}], "why is required"),
        ([{"match": "x.so", "gpus": "9.9", "why": "w"}], "gpus: cuda_arches: '9.9'"),
        ([{"match": "x.so", "why": "w"}], "changes nothing"),
        ([{"match": "/abs.so", "gpus": "9.0", "why": "w"}], "match must be a glob"),
        ([{"match": "x.so", "gpus": "9.0", "jit": "yes", "why": "w"}], "jit must be true or false"),
        ([{"match": "x.so", "gpu": "9.0", "why": "w"}], "unknown key 'gpu'"),
    ],
)
def test_bad_rules_are_bad_input_naming_the_entry(rules, needle):
    with pytest.raises(BadInput, match=re.escape(needle)):
        parse_rules(rules, "build.gate")


def test_family_gpus_span_the_family():
    (rule,) = parse_rules([{"match": "x.so", "gpus": "10.0f,9.0a", "why": "w"}], "build.gate")
    assert rule.covers(CC.SM_100) and rule.covers(CC.SM_103) and rule.covers(CC.SM_90)
    assert not rule.covers(CC.SM_120) and not rule.covers(CC.SM_110)

"""carry.arch: the arch-list grammar and its three renderings."""

import pytest

from carry.arch import ArchList, ComputeCapability, CudaTarget, Variant
from carry.util.errors import BadInput

CC = ComputeCapability


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("9.0", CudaTarget(CC.SM_90)),
        ("12.1", CudaTarget(CC.SM_121)),
        ("12.0f", CudaTarget(CC.SM_120, Variant.FAMILY)),
        ("12.1a", CudaTarget(CC.SM_121, Variant.ARCH_SPECIFIC)),
        ("12.1A", CudaTarget(CC.SM_121, Variant.ARCH_SPECIFIC)),
        ("sm_121", CudaTarget(CC.SM_121)),
        ("SM_121a", CudaTarget(CC.SM_121, Variant.ARCH_SPECIFIC)),
        ("sm_100f", CudaTarget(CC.SM_100, Variant.FAMILY)),
        ("sm_75", CudaTarget(CC.SM_75)),
        ("compute_90", CudaTarget(CC.SM_90, cubin=False, ptx=True)),
        ("compute_120f", CudaTarget(CC.SM_120, Variant.FAMILY, cubin=False, ptx=True)),
        ("9.0+PTX", CudaTarget(CC.SM_90, ptx=True)),
        ("9.0+ptx", CudaTarget(CC.SM_90, ptx=True)),
        ("10.3a+PTX", CudaTarget(CC.SM_103, Variant.ARCH_SPECIFIC, ptx=True)),
        ("11.0", CudaTarget(CC.SM_110)),
        ("8.7", CudaTarget(CC.SM_87)),
    ],
)
def test_parse_token(token, expected):
    assert CudaTarget.parse(token) == expected


@pytest.mark.parametrize(
    "text",
    [
        "9.0,12.0,12.1",
        "9.0;12.0;12.1",
        "9.0 12.0  12.1",
        " 9.0, 12.0 ;12.1 ",
        "sm_90 sm_120 sm_121",
    ],
)
def test_separators_all_give_the_same_list(text):
    assert str(ArchList.parse(text)) == "9.0,12.0,12.1"


def test_list_input_with_yaml_floats_and_strings():
    archlist = ArchList.parse([9.0, "12.0", "12.1+PTX"])
    assert str(archlist) == "9.0,12.0,12.1+PTX"


def test_duplicates_merge_in_first_seen_order():
    archlist = ArchList.parse("12.1 9.0 sm_121 compute_90 12.1a 12.1")
    assert [str(t) for t in archlist] == ["12.1", "9.0+PTX", "12.1a"]


def test_empty_list_is_allowed():
    archlist = ArchList.parse("")
    assert len(archlist) == 0 and not archlist
    assert archlist.gencode_flags() == []


@pytest.mark.parametrize("value", ["none", " NONE ", [], ["none"]])
def test_none_is_the_empty_list_and_renders_as_none(value):
    archlist = ArchList.parse(value)
    assert archlist == ArchList.parse("") and not archlist.expects_cuda
    assert str(archlist) == "none" and ArchList.parse(str(archlist)) == archlist
    assert ArchList.parse("9.0").expects_cuda


def test_none_cannot_be_combined_with_arches():
    with pytest.raises(BadInput, match="'none' means no CUDA code and cannot be combined"):
        ArchList.parse(["9.0", "none"])


@pytest.mark.parametrize(
    ("text", "canonical", "torch", "cmake", "gencode"),
    [
        (
            "9.0,12.0,12.1+PTX",
            "9.0,12.0,12.1+PTX",
            "9.0 12.0 12.1+PTX",
            "90-real;120-real;121-real;121-virtual",
            [
                "-gencode=arch=compute_90,code=sm_90",
                "-gencode=arch=compute_120,code=sm_120",
                "-gencode=arch=compute_121,code=sm_121",
                "-gencode=arch=compute_121,code=compute_121",
            ],
        ),
        (
            "compute_90",
            "compute_90",
            "9.0+PTX",
            "90-virtual",
            ["-gencode=arch=compute_90,code=compute_90"],
        ),
        (
            "sm_121a 12.0f",
            "12.1a,12.0f",
            "12.1a 12.0f",
            "121a-real;120f-real",
            [
                "-gencode=arch=compute_121a,code=sm_121a",
                "-gencode=arch=compute_120f,code=sm_120f",
            ],
        ),
        (
            "compute_120f;10.0a+PTX",
            "compute_120f,10.0a+PTX",
            "12.0f+PTX 10.0a+PTX",
            "120f-virtual;100a-real;100a-virtual",
            [
                "-gencode=arch=compute_120f,code=compute_120f",
                "-gencode=arch=compute_100a,code=sm_100a",
                "-gencode=arch=compute_100a,code=compute_100a",
            ],
        ),
    ],
)
def test_renderings(text, canonical, torch, cmake, gencode):
    archlist = ArchList.parse(text)
    assert str(archlist) == canonical
    assert archlist.torch_cuda_arch_list() == torch
    assert archlist.cmake_cuda_architectures() == cmake
    assert archlist.gencode_flags() == gencode


@pytest.mark.parametrize(
    "text",
    ["9.0 12.0 12.1", "compute_90 12.1a+PTX 10.0f", "sm_75;8.6;8.9+PTX;12.0f;compute_121a"],
)
def test_canonical_spelling_round_trips(text):
    archlist = ArchList.parse(text)
    assert ArchList.parse(str(archlist)) == archlist


@pytest.mark.parametrize(
    "token",
    [
        "9.1",  # no such capability
        "7.0",  # Volta: dropped by nvcc 13
        "12.1x",  # unknown suffix
        "9.0f",  # family variants start with Blackwell
        "8.6a",  # arch-specific variants start with Hopper
        "sm_90f",
        "compute_9",
        "compute_90+PTX",  # PTX-only already; +PTX is for cubin entries
        "sm90",
        "121",
        "12",
        "ampere",
        "12.1+ptx+ptx",
    ],
)
def test_bad_token_is_bad_input_naming_it(token):
    with pytest.raises(BadInput) as excinfo:
        ArchList.parse(f"9.0,{token}")
    message = str(excinfo.value)
    assert excinfo.value.exit_code == 2
    assert repr(token) in message
    assert "\n" not in message
    assert "sm_XY[a|f]" in message and "12.1" in message


def test_non_string_item_is_bad_input():
    with pytest.raises(BadInput, match="is not a string"):
        ArchList.parse(["9.0", None])

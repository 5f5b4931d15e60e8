"""The payload we carry for vLLM PR #53899: the series parses, and each patch is the minimal change it claims.

Upstream vLLM can't be fetched here; the online apply check runs in the ci/ workflows (`build.py check`).
"""

from __future__ import annotations

import re

import pytest

from carry import config
from carry.source import series
from carry.source.series import UpstreamState
from helpers import ROOT, assert_bad_input, carry

CONNECTOR = "vllm/v1/ple_offload/connector.py"
MODELOPT = "vllm/model_executor/layers/quantization/modelopt.py"


@pytest.fixture(scope="module")
def payload() -> series.Series:
    return series.load(ROOT / "patches")


def only_hunk(patch: series.Patch) -> series.Hunk:
    assert len(patch.diffs) == 1 and len(patch.diffs[0].hunks) == 1
    return patch.diffs[0].hunks[0]


def test_series_is_0001_then_0002_in_format_patch_form(payload):
    assert [p.number for p in payload.patches] == [1, 2]
    for patch in payload.patches:
        assert re.fullmatch(r"000[12]-[a-z0-9-]+\.patch", patch.name)
        assert patch.author and patch.date and patch.subject
        assert patch.path.read_text().startswith("From 0000000000000000000000000000000000000000 ")
        assert patch.forwarded and patch.forwarded.startswith("https://")
    assert len(payload.hash) == 64


def test_0002_adds_9_to_15_lines_inside_prepare_forward_only(payload):
    patch = payload.patches[1]
    assert patch.files == (CONNECTOR,)
    assert patch.upstream_status.state is UpstreamState.SUBMITTED
    assert patch.upstream_status.detail == "https://github.com/peakcrosser7/vllm/pull/13"
    assert 9 <= patch.added <= 15 and patch.removed == 0
    hunk = only_hunk(patch)
    assert "class PleOffloadConnector" in hunk.header
    lines = hunk.new_lines
    first_added = lines.index(hunk.added[0])
    before, after = lines[:first_added], lines[first_added + len(hunk.added) :]
    # Inside prepare_forward: after its dummy-run early return, before its call to _launch, and every added
    # line is method-body code (8+ spaces), so it is neither a new method nor module code.
    assert [line.strip() for line in before[-3:]] == [
        "if dummy_run:",
        "self.signal_dummy_outputs(num_tokens)",
        "return",
    ]
    assert after[0].strip().startswith("self._launch(")
    assert all(line.startswith(" " * 8) for line in hunk.added)
    assert not any(line.lstrip().startswith("def ") for line in hunk.added)
    code = [line.strip() for line in hunk.added if not line.strip().startswith("#")]
    assert any(".reset(" in line for line in code), "resets the semaphores"
    assert any("current_stream" in line for line in code), "on the model's current stream"


def test_0001_adds_only_the_fp8_per_channel_dispatch(payload):
    patch = payload.patches[0]
    assert patch.files == (MODELOPT,)
    hunk = only_hunk(patch)
    assert "class ModelOptMixedPrecisionConfig" in hunk.header
    assert [line.strip() for line in hunk.added] == [
        'if quant_algo == "FP8_PER_CHANNEL_PER_TOKEN":',
        "return ModelOptFp8PcPtLinearMethod(self.fp8_config)",
    ]
    assert patch.removed == 0
    assert patch.upstream_status is not None


def test_root_config_pins_the_pr_head_and_serves_gb10_first():
    loaded = config.load(ROOT / "build.yaml")
    assert loaded.upstream.url == "https://github.com/vllm-project/vllm.git"
    assert loaded.upstream.pr == 53899
    assert loaded.upstream.commit == "357e054428cdb7dd697fa75024c548aced0efee8"
    assert str(loaded.build.cuda_arches).split(",")[0] == "12.1"
    assert {"9.0", "10.0"} <= set(str(loaded.build.cuda_arches).split(","))
    assert loaded.build.env["VLLM_TARGET_DEVICE"] == "cuda"
    assert {str(target.platform) for target in loaded.image.platforms} == {"linux/arm64", "linux/amd64"}
    assert loaded.image.env["VLLM_USE_DEEP_GEMM"] == "0"
    assert "SYS_PTRACE" in " ".join(loaded.image.labels.values())


def test_root_config_check_offline_is_one_line_exit_2(tmp_path):
    result = carry("--config", str(ROOT / "build.yaml"), "check", env={"CARRY_CACHE": str(tmp_path / "cache")})
    assert_bad_input(result, "github.com/vllm-project/vllm", "no bundle")
    assert not (tmp_path / "cache").exists()

"""Map a checkpoint's quantization algorithm to the kernel path that runs it.

Checkpoints name their scheme in `quant_algo` (as in a ModelOpt
hf_quant_config.json); the loader asks get_quant_method() which path to take.
"""

from enum import Enum


class QuantMethod(Enum):
    """Quantized matmul paths and how their activation scales are laid out."""

    FP8_PER_TENSOR = "fp8_per_tensor"
    FP8_PER_CHANNEL_PER_TOKEN = "fp8_per_channel_per_token"
    NVFP4 = "nvfp4"

    @property
    def scales_per_token(self) -> bool:
        """True when activations carry one scale per token, not one per tensor."""
        return self is QuantMethod.FP8_PER_CHANNEL_PER_TOKEN


SUPPORTED_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4")


def get_quant_method(quant_algo: str) -> QuantMethod:
    """Return the path for `quant_algo`, or raise ValueError naming the known ones."""
    algo = quant_algo.upper()
    if algo == "FP8":
        return QuantMethod.FP8_PER_TENSOR
    if algo == "NVFP4":
        return QuantMethod.NVFP4
    raise ValueError(
        f"unsupported quant_algo {quant_algo!r}; expected one of {', '.join(SUPPORTED_ALGOS)}"
    )

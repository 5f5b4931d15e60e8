"""Carry's check for 0005: round_up with a multiple that is not positive raises ValueError naming it.

Runs in a checkout of vLLM's sources and loads vllm/utils/math_utils.py from its file (standard library only)."""

import importlib.util
import sys

spec = importlib.util.spec_from_file_location("math_utils", "vllm/utils/math_utils.py")
math_utils = importlib.util.module_from_spec(spec)
spec.loader.exec_module(math_utils)

assert math_utils.round_up(5, 4) == 8
try:
    math_utils.round_up(5, 0)
except ValueError as exc:
    print(f"round_up(5, 0) -> ValueError: {exc}")
    sys.exit(0)
except ZeroDivisionError as exc:
    print(f"round_up(5, 0) -> ZeroDivisionError: {exc} (want a ValueError naming the multiple)")
    sys.exit(1)
print("round_up(5, 0) returned without an error")
sys.exit(1)

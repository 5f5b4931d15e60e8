"""Carry's check for 0004: a user message that only carries tool results is not the last user turn.

Runs in a checkout of vLLM's sources (the working directory) and loads the one module it needs from its file, so the
vllm package (which needs torch) is never imported."""

import importlib.util
import sys

spec = importlib.util.spec_from_file_location("encoding", "vllm/tokenizers/deepseek_v41_encoding.py")
encoding = importlib.util.module_from_spec(spec)
spec.loader.exec_module(encoding)

messages = [
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
    },
    {"role": "user", "content_blocks": [{"type": "tool_result", "tool_use_id": "call-1", "content": "sunny"}]},
]
found = encoding.find_last_user_index(messages)
print(f"find_last_user_index -> {found} (want 0: the question, not the tool results)")
sys.exit(0 if found == 0 else 1)

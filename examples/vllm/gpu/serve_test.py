"""vLLM served from the image on a GPU, with nothing from a hub: examples/vllm's build.tests entry
(`carry test IMAGE` runs it in the image with `docker run --gpus all`, the project mounted read-only; `carry test
WHEEL` in a venv beside torch). docs/gpu-testing.md says what it proves.

1. A dummy-weight model made here: a 2-layer Llama config (vLLM's `--load-format dummy` fills the weights with the
   same seeded values in every process), no tokenizer (`skip_tokenizer_init`, prompts as token ids).
2. Offline generation in two fresh processes, CUDA graphs on (vLLM's default) and `enforce_eager=True`: 3 prompts, 24
   greedy tokens each with their log-probabilities. The tokens must be equal, the log-probabilities within LOGPROB_TOL.
   This is the first GPU use of Triton (its driver compiled with the image's C compiler) and of FlashInfer's sampler
   (JIT-compiled with the image's CUDA_HOME): the defects an H200 showed in the first pushed image.
3. `vllm serve` on loopback: healthy, then one /v1/completions answer of MAX_SERVE tokens, equal to the offline ones.
   It runs first (what users do; the offline engines then find FlashInfer's kernels compiled).

Prints one line `RESULT {json}` (versions, the GPU, engine start and generation seconds per mode, the serve
timings) and exits 0 only when every step passed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PROMPTS = [[1, 5, 17, 42, 99, 256, 511, 1000], list(range(3, 40)), [7] * 5]
TOKENS = 24
MAX_SERVE = 8
LOGPROB_TOL = 0.05  # graphs and eager may sum in another order: tokens equal, log-probabilities this close
ENGINE = {"load_format": "dummy", "skip_tokenizer_init": True, "gpu_memory_utilization": 0.3, "max_model_len": 512}
START_S = 900  # an engine's first start JIT-compiles FlashInfer's kernels and captures graphs
STARTED = time.monotonic()


def make_model(where: str) -> str:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "config.json"), "w") as handle:
        json.dump(config, handle)
    with open(os.path.join(where, "generation_config.json"), "w") as handle:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, handle)
    return where


def generate(mode: str, model: str, out: str) -> None:
    """One engine in this process (graphs or eager): the tokens and log-probabilities of PROMPTS, and its times."""
    started = time.monotonic()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    found = {"mode": mode, "vllm": vllm.__version__, "torch": torch.__version__, "import_s": 0.0}
    found["import_s"] = round(time.monotonic() - started, 1)
    found["gpu"] = torch.cuda.get_device_name(0)
    clock = time.monotonic()
    llm = LLM(model=model, seed=0, enforce_eager=(mode == "eager"), **ENGINE)
    found["engine_s"] = round(time.monotonic() - clock, 1)
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, detokenize=False, logprobs=1)
    clock = time.monotonic()
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    found["first_generation_s"] = round(time.monotonic() - clock, 2)
    found["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    found["logprobs"] = [
        [step[token].logprob for token, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs or [])]
        for o in outputs
    ]
    with open(out, "w") as handle:
        json.dump(found, handle)
    os._exit(0)  # the engine's workers need no orderly shutdown here


def offline(mode: str, model: str, work: str) -> dict:
    """One fresh process generating in `mode`, its output in WORK/<mode>.log as it runs."""
    out, log = os.path.join(work, f"{mode}.json"), os.path.join(work, f"{mode}.log")
    clock = time.monotonic()
    with open(log, "w") as handle:
        code = subprocess.run(
            [sys.executable, __file__, "--generate", mode, model, out], timeout=START_S, stdout=handle, stderr=handle
        ).returncode
    if code != 0 or not os.path.exists(out):
        raise SystemExit(f"FAIL {mode}: exit {code} after {time.monotonic() - clock:.0f} s\n" + _excerpt_of(log))
    with open(out) as handle:
        found = json.load(handle)
    times = f"import {found['import_s']} s, engine {found['engine_s']} s, generation {found['first_generation_s']} s"
    step(f"{mode}: {times}")
    return found


def step(line: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.0f}s] {line}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.load(answer)


def serve(model: str, work: str) -> dict:
    """`vllm serve` on loopback until healthy, then one completion of PROMPTS[0] (token ids in, token ids out)."""
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")  # noqa: SIM115 (the server's whole life, closed below)
    argv = [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", model, "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--load-format", "dummy", "--skip-tokenizer-init", "--seed", "0"]
    argv += ["--gpu-memory-utilization", "0.3", "--max-model-len", "512"]
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    clock, found = time.monotonic(), {}
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"FAIL serve: exited {server.returncode}\n" + _excerpt_of(log.name))
            if time.monotonic() - clock > START_S:
                raise SystemExit(f"FAIL serve: not healthy after {START_S} s\n" + _excerpt_of(log.name))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(2)
        found["healthy_s"] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()
        answer = post(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": model, "prompt": PROMPTS[0], "max_tokens": MAX_SERVE, "temperature": 0, "return_token_ids": True},
        )
        found["answer_s"] = round(time.monotonic() - clock, 2)
        choice = answer["choices"][0]
        found["completion_tokens"] = answer["usage"]["completion_tokens"]
        found["token_ids"] = choice.get("token_ids")
        found["finish_reason"] = choice.get("finish_reason")
        return found
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def excerpt(text: str) -> str:
    """The first error with what led to it (an engine's first failure is the cause; the last lines are its
    processes shutting down), then the last lines."""
    lines = text.strip().splitlines()
    first = next((i for i, line in enumerate(lines) if "Traceback" in line or "Error" in line), None)
    if first is None:
        return "\n".join(lines[-25:])
    if first + 60 >= len(lines) - 15:
        return "\n".join(lines[first:])
    return "\n".join(lines[first : first + 60] + ["..."] + lines[-15:])


def _excerpt_of(path: str) -> str:
    with open(path, errors="replace") as handle:
        return excerpt(handle.read())


def compare(graph: dict, eager: dict) -> tuple[list[str], float]:
    """What differs between the two modes' generations, and the largest log-probability difference."""
    problems = []
    if graph["tokens"] != eager["tokens"]:
        problems.append(f"tokens differ: graphs {graph['tokens']} eager {eager['tokens']}")
    drift = max(
        (abs(a - b) for ga, ea in zip(graph["logprobs"], eager["logprobs"]) for a, b in zip(ga, ea)), default=0.0
    )
    if drift > LOGPROB_TOL or any(len(g) != TOKENS for g in graph["logprobs"]):
        problems.append(f"log-probabilities differ by {drift:.4f} (tolerance {LOGPROB_TOL}) or are missing")
    return problems, drift


def main(parent: str | None = None) -> int:
    """`--work DIR`: each step's log under DIR, where a host that stops the run can still read it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if parent:
        os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="carry-gpu-", dir=parent) as work:
        model = make_model(os.path.join(work, "model"))
        step(f"model in {work}; each step's output in {work}/<step>.log")
        step(f"serve: starting (its output in {work}/serve.log)")
        served = serve(model, work)
        step(f"serve: healthy in {served['healthy_s']} s, answered {served['token_ids']} in {served['answer_s']} s")
        graph = offline("graph", model, work)
        eager = offline("eager", model, work)
        problems, drift = compare(graph, eager)
        step(f"graphs vs eager: {'; '.join(problems) or 'same tokens'}, log-probabilities within {drift:.5f}")
    if served["completion_tokens"] != MAX_SERVE:
        problems.append(f"serve answered {served['completion_tokens']} token(s), not {MAX_SERVE}")
    if served["token_ids"] is not None and served["token_ids"] != graph["tokens"][0][:MAX_SERVE]:
        problems.append(
            f"serve's tokens {served['token_ids']} are not the offline ones {graph['tokens'][0][:MAX_SERVE]}"
        )
    result = {
        "passed": not problems,
        "problems": problems,
        "vllm": graph["vllm"],
        "torch": graph["torch"],
        "gpu": graph["gpu"],
        "graph": {k: graph[k] for k in ("import_s", "engine_s", "first_generation_s")},
        "eager": {k: eager[k] for k in ("import_s", "engine_s", "first_generation_s")},
        "logprob_max_diff": round(drift, 5),
        "tokens": graph["tokens"],
        "serve": served,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--generate":
        generate(*sys.argv[2:])
    sys.exit(main(sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == "--work" else None))

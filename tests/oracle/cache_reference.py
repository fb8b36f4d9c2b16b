#!/usr/bin/env python3
"""Reference generations of Python mlx-lm 0.32.2 for the mlx-gen KV cache oracle tests.

cache_reference.py < cases.json

Each case is one of
  {"op": "generate", "model": DIR, "prompt": TEXT, "max_tokens": N, "ignore_chat_template": bool,
   "seed": S or null, "temp": T, "max_kv_size": N or null, "kv_bits": B or null, "kv_group_size": G,
   "quantized_kv_start": Q, "prefill_step_size": P, "prompt_cache_file": FILE or null}
  {"op": "cache_prompt", "model": DIR, "prompt": TEXT, "prompt_cache_file": FILE, "max_kv_size",
   "kv_bits", "kv_group_size", "quantized_kv_start"}
run as mlx_lm.generate's and mlx_lm.cache_prompt's main() do. Prints a JSON list: per generate case
{"tokens": [...]} (greedy or seeded, stopping at EOS, EOS not included); per cache_prompt case {}.
"""

import json
import sys

from reference import build_prompt


def generate(case):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import load_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    if case.get("seed") is not None:
        mx.random.seed(case["seed"])
    prompt_cache = None
    if case.get("prompt_cache_file"):
        prompt_cache, _ = load_prompt_cache(case["prompt_cache_file"], return_metadata=True)
    model, tokenizer = load(
        case["model"], tokenizer_config={"trust_remote_code": False}, model_config={"quantize_activations": False}
    )
    ignore = case.get("ignore_chat_template", False)
    if prompt_cache is None:
        ids = build_prompt(tokenizer, case["prompt"], ignore)
    else:
        prompt = case["prompt"]
        use_chat_template = not ignore and tokenizer.has_chat_template
        if use_chat_template:
            messages = [{"role": "user", "content": prompt}]
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            messages[-1]["content"] = "<query>"
            test = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompt = prompt[test.index("<query>"):]
        ids = tokenizer.encode(prompt, add_special_tokens=not use_chat_template)
    sampler = make_sampler(case.get("temp", 0.0), 0.0, 0.0, 1, top_k=0)
    tokens = []
    for resp in stream_generate(
        model,
        tokenizer,
        ids,
        max_tokens=case["max_tokens"],
        sampler=sampler,
        max_kv_size=case.get("max_kv_size"),
        prompt_cache=prompt_cache,
        prefill_step_size=case.get("prefill_step_size", 2048),
        kv_bits=case.get("kv_bits"),
        kv_group_size=case.get("kv_group_size", 64),
        quantized_kv_start=case.get("quantized_kv_start", 5000),
    ):
        if resp.finish_reason == "stop":
            break
        tokens.append(resp.token)
    return {"tokens": tokens}


def cache_prompt(case):
    import subprocess

    args = [sys.executable, "-m", "mlx_lm", "cache_prompt", "--model", case["model"], "--prompt", case["prompt"],
            "--prompt-cache-file", case["prompt_cache_file"]]
    for k in ["max_kv_size", "kv_bits", "kv_group_size", "quantized_kv_start"]:
        if case.get(k) is not None:
            args += ["--" + k.replace("_", "-"), str(case[k])]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return {}


def main():
    cases = json.load(sys.stdin)
    out = [generate(c) if c["op"] == "generate" else cache_prompt(c) for c in cases]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

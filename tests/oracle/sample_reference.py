#!/usr/bin/env python3
"""Reference sampled generations of Python mlx-lm 0.32.2 for the mlx-gen sampling oracle tests.

sample_reference.py < cases.json

Reads a JSON list of cases, each:
  {"model": DIR, "prompt": TEXT, "max_tokens": N, "seed": S, "top_logprobs": K,
   "sampler": {"temp", "top_p", "min_p", "min_tokens_to_keep", "top_k", "xtc_probability",
               "xtc_threshold"},
   "processors": {"logit_bias": {"ID": BIAS-as-string}, "repetition_penalty", "repetition_context_size",
                  "presence_penalty", "presence_context_size", "frequency_penalty",
                  "frequency_context_size"}}
and runs each as `mlx_lm.generate --seed S` does: mx.random.seed, then load (which draws from the
key), make_sampler with xtc_special_tokens = encode("\\n") + eos_token_ids, make_logits_processors,
stream_generate, stopping at EOS (not included). Prints a JSON list, per case:
  {"tokens": [...], "logprobs": [...], "top_logprobs": [[[id, logprob], ...], ...], "draws": N}
with float32 logprobs and the top K sorted by decreasing logprob then increasing id, and `draws`
the number of global-key splits that load made.
"""

import json
import sys

import numpy as np

from reference import build_prompt, sampling_from_case


def count_draws(model_dir):
    """How many times mlx_lm.load splits MLX's global key for this model."""
    import mlx.core as mx
    from mlx_lm import load

    mx.random.seed(12345)
    load(model_dir)
    after = mx.random.uniform().item()
    mx.random.seed(12345)
    for n in range(100000):
        if mx.random.uniform().item() == after:
            return n
    return -1


def run_case(case):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    mx.random.seed(case["seed"])
    model, tokenizer = load(
        case["model"],
        tokenizer_config={"trust_remote_code": False},
        model_config={"quantize_activations": False},
    )
    prompt_ids = build_prompt(tokenizer, case["prompt"])
    sampler, processors = sampling_from_case(case, tokenizer)
    k = case.get("top_logprobs", 0)
    tokens, logprobs, tops = [], [], []
    for resp in stream_generate(
        model, tokenizer, prompt_ids, max_tokens=case["max_tokens"], sampler=sampler,
        logits_processors=processors,
    ):
        if resp.finish_reason == "stop":
            break
        lp = np.array(resp.logprobs.astype(mx.float32))
        tokens.append(int(resp.token))
        logprobs.append(float(lp[resp.token]))
        if k > 0:
            order = np.lexsort((np.arange(lp.size), -lp))[:k]
            tops.append([[int(i), float(lp[i])] for i in order])
    return {"tokens": tokens, "logprobs": logprobs, "top_logprobs": tops}


def main():
    cases = json.load(sys.stdin)
    out = []
    draws = {}
    for case in cases:
        r = run_case(case)
        if case["model"] not in draws:
            draws[case["model"]] = count_draws(case["model"])
        r["draws"] = draws[case["model"]]
        out.append(r)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

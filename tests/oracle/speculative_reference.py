#!/usr/bin/env python3
"""Reference speculative generations of Python mlx-lm 0.32.2 for the mlx-gen speculative decoding tests.

speculative_reference.py < cases.json

Reads a JSON list of cases, each:
  {"model": DIR, "draft": DIR, "prompt": TEXT, "max_tokens": N, "seed": S, "num_draft_tokens": K,
   "sampler": {"temp", "top_p", "min_p", "min_tokens_to_keep", "top_k", "xtc_probability",
               "xtc_threshold"},
   "processors": {"logit_bias": {"ID": BIAS-as-string}, "repetition_penalty", ...}}
and runs each as `mlx_lm.generate --seed S --draft-model DRAFT --num-draft-tokens K` does:
mx.random.seed, load the model (which draws from the key), build the prompt, load the draft (more
draws), make_sampler with xtc_special_tokens = encode("\\n") + eos_token_ids, then stream_generate
with draft_model (speculative_generate_step), stopping at EOS (not included). The logits
processors (which mlx_lm.generate's command line does not offer) are make_logits_processors'.
Prints a JSON list, per case:
  {"tokens": [...], "logprobs": [...], "from_draft": [...]}
"""

import json
import sys

import numpy as np

from reference import build_prompt, sampling_from_case


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
    draft_model, draft_tokenizer = load(case["draft"])
    assert draft_tokenizer.vocab_size == tokenizer.vocab_size
    sampler, processors = sampling_from_case(case, tokenizer)
    tokens, logprobs, from_draft = [], [], []
    for resp in stream_generate(
        model, tokenizer, prompt_ids, max_tokens=case["max_tokens"], draft_model=draft_model,
        num_draft_tokens=case.get("num_draft_tokens", 3), sampler=sampler,
        logits_processors=processors, prefill_step_size=2048,
    ):
        if resp.finish_reason == "stop":
            break
        lp = np.array(resp.logprobs.astype(mx.float32))
        tokens.append(int(resp.token))
        logprobs.append(float(lp[resp.token]))
        from_draft.append(bool(resp.from_draft))
    return {"tokens": tokens, "logprobs": logprobs, "from_draft": from_draft}


def main():
    cases = json.load(sys.stdin)
    json.dump([run_case(c) for c in cases], sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

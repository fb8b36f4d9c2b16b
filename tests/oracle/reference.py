#!/usr/bin/env python3
"""Reference output of Python mlx-lm for the mlx-gen oracle tests.

reference.py --model DIR --prompt TEXT --max-tokens N [--ignore-chat-template] [--system-prompt S]

Prints one JSON object:
  prompt_ids   the prompt exactly as `mlx_lm.generate`'s main() builds it (escape handling, `-` reads
               stdin, chat template unless ignored/absent, then tokenizer.encode as main() does)
  tokens       greedy (temp 0) tokens from mlx_lm's stream_generate, stopping at EOS as
               mlx_lm.generate does; the EOS itself is not included
  text         the response text mlx_lm.generate returns/prints (streaming detokenizer)
  finish_reason, prompt_tokens, generation_tokens, eos_token_ids
  logits       float32 last-position logits of one full forward pass over prompt_ids with a fresh
               cache: model(mx.array(prompt_ids)[None], cache=make_prompt_cache(model))[0, -1]
"""

import argparse
import json
import sys


def build_prompt(tokenizer, prompt, ignore_chat_template=False, system_prompt=None):
    # Mirrors mlx_lm/generate.py main().
    prompt = prompt.replace("\\n", "\n").replace("\\t", "\t")
    prompt = sys.stdin.read() if prompt == "-" else prompt
    use_chat_template = not ignore_chat_template and tokenizer.has_chat_template
    if use_chat_template:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        messages.append({"role": "user", "content": prompt})
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=False, continue_final_message=False, add_generation_prompt=True
        )
    return tokenizer.encode(prompt, add_special_tokens=not use_chat_template)


def sampling_from_case(case, tokenizer):
    """The sampler and logits processors of a test case's "sampler" and "processors" settings, as
    mlx_lm.generate makes them (xtc_special_tokens = encode("\\n") + eos_token_ids)."""
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    s = case.get("sampler", {})
    sampler = make_sampler(
        s.get("temp", 0.0),
        s.get("top_p", 1.0),
        s.get("min_p", 0.0),
        s.get("min_tokens_to_keep", 1),
        top_k=s.get("top_k", 0),
        xtc_probability=s.get("xtc_probability", 0.0),
        xtc_threshold=s.get("xtc_threshold", 0.1),
        xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids),
    )
    p = case.get("processors", {})
    bias = {int(k): float(v) for k, v in p.get("logit_bias", {}).items()} or None
    processors = make_logits_processors(
        bias,
        p.get("repetition_penalty"),
        p.get("repetition_context_size", 20),
        p.get("presence_penalty"),
        p.get("presence_context_size", 20),
        p.get("frequency_penalty"),
        p.get("frequency_context_size", 20),
    )
    return sampler, processors



def run(model_dir, prompt, max_tokens, ignore_chat_template=False, system_prompt=None, with_logits=True):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    # As main(): tokenizer_config {"trust_remote_code": False}, model_config quantize_activations off.
    model, tokenizer, config = load(
        model_dir,
        tokenizer_config={"trust_remote_code": False},
        model_config={"quantize_activations": False},
        return_config=True,
    )
    prompt_ids = build_prompt(tokenizer, prompt, ignore_chat_template, system_prompt)
    if len(prompt_ids) == 0:
        raise SystemExit("empty prompt")

    # main() defaults: temp 0, top_p 0, min_p 0, top_k 0, xtc 0 -> greedy argmax.
    sampler = make_sampler(0.0, 0.0, 0.0, 1, top_k=0)
    tokens, text, last = [], "", None
    for resp in stream_generate(model, tokenizer, prompt_ids, max_tokens=max_tokens, sampler=sampler):
        text += resp.text
        last = resp
        if resp.finish_reason == "stop":  # the EOS token: not part of the output
            break
        tokens.append(int(resp.token))

    out = {
        "prompt_ids": [int(t) for t in prompt_ids],
        "tokens": tokens,
        "text": text,
        "finish_reason": last.finish_reason if last is not None else None,
        "prompt_tokens": len(prompt_ids),
        "generation_tokens": len(tokens),
        "eos_token_ids": sorted(int(t) for t in tokenizer.eos_token_ids),
    }
    if with_logits:
        logits = model(mx.array(prompt_ids)[None], cache=make_prompt_cache(model))[0, -1]
        logits = logits.astype(mx.float32)
        mx.eval(logits)
        out["logits"] = [float(x) for x in logits.tolist()]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--ignore-chat-template", action="store_true")
    ap.add_argument("--system-prompt", default=None)
    ap.add_argument("--no-logits", action="store_true")
    args = ap.parse_args()
    out = run(args.model, args.prompt, args.max_tokens, args.ignore_chat_template,
              args.system_prompt, with_logits=not args.no_logits)
    json.dump(out, sys.stdout, ensure_ascii=True)  # locale-proof; serde_json decodes the escapes
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

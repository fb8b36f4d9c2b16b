#!/usr/bin/env python3
"""Python mlx-lm's sharded generation, the reference for mlx-gen's distributed tests.

Run on every rank by `mlx.launch` (ring backend):
  mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring sharded_reference.py \
      --model DIR --prompt TEXT --max-tokens N [--pipeline]

Each rank loads its part with mlx_lm.utils.sharded_load (tensor parallel through the model's
`shard`, or with --pipeline its `pipeline` layer split, as mlx_lm.chat and mlx_lm.benchmark do), then
generates greedily with stream_generate from the raw prompt (`--ignore-chat-template`: encoded with
the special tokens, as reference.py builds it), stopping at EOS. Rank 0 prints one JSON object
{"prompt_ids", "tokens", "logprobs" (each token's log-probability), "group_size"}; the other ranks
print nothing.
"""

import argparse
import json

from reference import build_prompt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--pipeline", action="store_true")
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import sharded_load

    group = mx.distributed.init(strict=True, backend="ring")
    pipeline_group = group if args.pipeline else None
    tensor_group = None if args.pipeline else group
    model, tokenizer = sharded_load(args.model, pipeline_group, tensor_group)
    prompt_ids = build_prompt(tokenizer, args.prompt, ignore_chat_template=True)
    sampler = make_sampler(0.0, 0.0, 0.0, 1, top_k=0)
    tokens, logprobs = [], []
    for resp in stream_generate(model, tokenizer, prompt_ids, max_tokens=args.max_tokens, sampler=sampler):
        if resp.finish_reason == "stop":
            break
        tokens.append(int(resp.token))
        logprobs.append(float(resp.logprobs[resp.token]))
    # Let the step queued after the last token finish on every rank before any rank exits (a rank
    # that leaves early breaks the ring under the others).
    mx.synchronize()
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))
    if group.rank() == 0:
        ids = [int(t) for t in prompt_ids]
        print(json.dumps({"prompt_ids": ids, "tokens": tokens, "logprobs": logprobs, "group_size": group.size()}))


if __name__ == "__main__":
    main()

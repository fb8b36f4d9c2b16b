#!/usr/bin/env python3
"""Where a decode step's time goes in mlx-lm: building the graph (the model's Python code), MLX queueing it
(async_eval: MLX encodes every primitive on the calling thread), and waiting for the token. The same split
as `MLX_GEN_TRACE=1 mlx-gen bench` prints ("build+queue (graph, queue), wait"), greedy, mlx-lm's own
generate_step order (the next step queued before the current token is read, on a generation stream).

Usage: mlx_lm_step_split.py --model DIR [-p 128] [-g 256]
"""
import argparse
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=128)
    ap.add_argument("-g", "--generation-tokens", type=int, default=256)
    args = ap.parse_args()
    mx.random.seed(0)
    model, _, config = load(args.model, return_config=True)
    prompt = mx.random.randint(0, config["vocab_size"], (args.prompt_tokens,))
    stream = mx.new_stream(mx.default_device())

    def step(y, cache):
        with mx.stream(stream):
            logits = model(y[None], cache=cache)[:, -1, :]
            return mx.argmax(logits, axis=-1)

    for trial in range(2):  # the first warms up
        cache = make_prompt_cache(model)
        with mx.stream(stream):
            model(prompt[None, :-1], cache=cache)
            mx.eval([c.state for c in cache])
        y = step(prompt[-1:], cache)
        mx.async_eval(y)
        graph = queue = wait = 0.0
        n = args.generation_tokens
        for _ in range(n):
            t0 = time.perf_counter()
            nxt = step(y, cache)
            t1 = time.perf_counter()
            mx.async_eval(nxt)
            t2 = time.perf_counter()
            y.item()
            t3 = time.perf_counter()
            graph, queue, wait = graph + t1 - t0, queue + t2 - t1, wait + t3 - t2
            y = nxt
        y.item()
        if trial:
            ms = lambda s: 1e3 * s / n  # noqa: E731
            print(f"mlx-lm step split: {n} tokens, build+queue {ms(graph + queue):.3f} ms/token "
                  f"(graph {ms(graph):.3f}, queue {ms(queue):.3f}), wait {ms(wait):.3f} ms/token, "
                  f"{n / (graph + queue + wait):.1f} tok/s")


if __name__ == "__main__":
    main()

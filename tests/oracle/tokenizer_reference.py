#!/usr/bin/env python3
"""Prints what mlx-lm 0.32.2 (on transformers) does with a tokenizer directory (test-only oracle).

Usage: tokenizer_reference.py TOKDIR < request.json > response.json

The request is a JSON object (all keys optional):
  {"encode": [text, ...],                 # -> {"with": ids, "without": ids} each (add_special_tokens on/off)
   "decode": [[id, ...], ...],            # -> {"keep": text, "skip": text} each (skip_special_tokens off/on)
   "stream": [[id, ...], ...],            # -> mlx-lm's own detokenizer: {"segments": [last_segment after each
                                          #    add_token, then after finalize], "text": final text}
   "chat":   [{"messages": [...], "add_generation_prompt": bool, "kwargs": {...}}, ...]
                                          # -> {"text": rendered, "ids": encode(text, add_special_tokens=False)}
                                          #    or {"error": message}
   "tokens": [token, ...]}                # -> token id or null (the tokenizer's vocab incl. added tokens)
or {"requests": [{"dir": TOKDIR2, ...same keys...}, ...]} to ask about several directories in one run
(answered as {"responses": [...]}). Every answer also holds vocab_size, eos_token_ids, bos_token,
has_chat_template, has_thinking and the detokenizer class mlx-lm chose.
"""

import json
import os
import sys
from pathlib import Path


def answer(tokdir, req):
    from mlx_lm.tokenizer_utils import load

    tok = load(Path(tokdir))
    detok_proto = tok._detokenizer
    out = {
        "vocab_size": len(tok),
        "eos_token_ids": sorted(tok.eos_token_ids),
        "bos_token": tok.bos_token,
        "has_chat_template": tok.has_chat_template,
        "has_thinking": tok.has_thinking,
        "detokenizer": type(detok_proto).__name__,
        "trim_space": getattr(detok_proto, "trim_space", None),
    }
    out["encode"] = [
        {"with": tok.encode(t, add_special_tokens=True), "without": tok.encode(t, add_special_tokens=False)}
        for t in req.get("encode", [])
    ]
    out["decode"] = [
        {"keep": tok.decode(ids), "skip": tok.decode(ids, skip_special_tokens=True)} for ids in req.get("decode", [])
    ]
    streams = []
    for ids in req.get("stream", []):
        d = tok.detokenizer
        segments = []
        for i in ids:
            d.add_token(i)
            segments.append(d.last_segment)
        d.finalize()
        segments.append(d.last_segment)
        streams.append({"segments": segments, "text": d.text})
    out["stream"] = streams
    chats = []
    for c in req.get("chat", []):
        try:
            text = tok.apply_chat_template(
                c["messages"],
                tokenize=False,
                add_generation_prompt=c.get("add_generation_prompt", True),
                **c.get("kwargs", {}),
            )
            chats.append({"text": text, "ids": tok.encode(text, add_special_tokens=False)})
        except Exception as e:  # noqa: BLE001 - any failure is an expected answer here
            chats.append({"error": f"{type(e).__name__}: {e}"})
    out["chat"] = chats
    vocab = tok.get_vocab()
    out["tokens"] = [vocab.get(t) for t in req.get("tokens", [])]
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    req = json.load(sys.stdin)
    if "requests" in req:
        resp = {"responses": [answer(r.get("dir", sys.argv[1]), r) for r in req["requests"]]}
    else:
        resp = answer(sys.argv[1], req)
    json.dump(resp, sys.stdout, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes a tiny synthetic llama GGUF for the GGUF import tests, with the `gguf` package.

gguf_make_synthetic.py OUT_DIR

Writes OUT_DIR/tiny.gguf (one llama layer; tensors of types Q8_0, Q4_0, Q4_1, Q6_K, F16, Q4_K, Q5_0,
Q5_K, F32, BF16 and a byte-level BPE tokenizer) and, per tensor, OUT_DIR/ref/NAME.f32: the values of
gguf-py's reference `dequantize`, float32 little-endian, in GGUF row order (not unpermuted), plus
OUT_DIR/ref/manifest.json mapping each tensor name to its type and shape.
"""

import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 256, 4, 2, 512, 300


def raw_blocks(rng, qtype, rows, cols):
    """Random raw blocks of a K-quant type with sane float16 super-block scales."""
    block, size = quants.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    d = rng.uniform(1e-5, 1e-4, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    dmin = rng.uniform(0.0, 1e-4, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == T.Q6_K:
        data[:, 208:210] = d
    else:  # Q4_K, Q5_K: d then dmin first
        data[:, 0:2] = d
        data[:, 2:4] = dmin
    return data.reshape(rows, cols // block * size)


def add_tokenizer(w, pre):
    """A byte-level BPE vocabulary of VOCAB tokens: three control tokens, the 256 byte symbols,
    merges, then padding; `pre` is tokenizer.ggml.pre."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    syms = list(bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + syms
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    tokens += [f"<extra_{i}>" for i in range(VOCAB - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    rng = np.random.default_rng(1234)
    w = GGUFWriter(os.path.join(out, "tiny.gguf"), "llama")
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    add_tokenizer(w, "smollm")

    def floats(rows, cols, scale=0.05):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    specs = [
        ("token_embd.weight", T.Q8_0, VOCAB, HIDDEN),
        ("blk.0.attn_norm.weight", T.F32, 1, HIDDEN),
        ("blk.0.attn_q.weight", T.Q4_0, HIDDEN, HIDDEN),
        ("blk.0.attn_k.weight", T.Q4_1, HIDDEN // HEADS * KV_HEADS, HIDDEN),
        ("blk.0.attn_v.weight", T.Q6_K, HIDDEN // HEADS * KV_HEADS, HIDDEN),
        ("blk.0.attn_output.weight", T.F16, HIDDEN, HIDDEN),
        ("blk.0.ffn_norm.weight", T.BF16, 1, HIDDEN),
        ("blk.0.ffn_gate.weight", T.Q4_K, FFN, HIDDEN),
        ("blk.0.ffn_up.weight", T.Q5_0, FFN, HIDDEN),
        ("blk.0.ffn_down.weight", T.Q5_K, HIDDEN, FFN),
        ("output_norm.weight", T.F32, 1, HIDDEN),
        ("output.weight", T.Q4_1, VOCAB, HIDDEN),
    ]
    manifest = {}
    for name, qtype, rows, cols in specs:
        if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
            data = raw_blocks(rng, qtype, rows, cols)
        elif name.endswith("norm.weight"):
            data = quants.quantize(1.0 + floats(1, cols, 0.1)[0], qtype)
        else:
            data = quants.quantize(floats(rows, cols), qtype)
        shape = [cols] if rows == 1 else [rows, cols]
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, data.reshape(shape))
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
        ref = quants.dequantize(data, qtype).astype("<f4").reshape(shape)
        ref.tofile(os.path.join(out, "ref", name + ".f32"))
        manifest[name] = {"type": qtype.name, "shape": shape}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(out, "ref", "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()

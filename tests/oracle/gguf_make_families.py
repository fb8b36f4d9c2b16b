#!/usr/bin/env python3
"""Writes tiny float32 GGUFs of the current model families for the GGUF import tests, with the
`gguf` package, plus raw Q2_K / Q3_K blocks and gguf-py's dequantization of them.

gguf_make_families.py OUT_DIR

OUT_DIR/llama3.gguf      llama, 2 layers, Llama 3.1-style `rope_freqs` (factor 8, low 1, high 4,
                         original context 8192, as convert_hf_to_gguf.py computes them)
OUT_DIR/llama32.gguf     the same with Llama 3.2's factor 32, and llama.rope.scaling.factor /
                         original_context_length in the metadata
OUT_DIR/llama3_bad.gguf  the same with one rope_freqs value changed (no llama3 parameters fit)
OUT_DIR/qwen3.gguf       qwen3, q/k norms, tied embeddings
OUT_DIR/qwen3moe.gguf    qwen3moe, 4 experts (2 per token) stacked as ffn_{gate,up,down}_exps
OUT_DIR/iq2.gguf         llama with one IQ2_XXS tensor (a type the import does not read)
OUT_DIR/kq/{Q2_K,Q3_K}.bin / .f32   random raw blocks / `gguf.quants.dequantize` of them (float32 LE)
"""

import math
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_make_synthetic import VOCAB, add_tokenizer  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 64, 4, 2, 16, 128, 2
EXPERTS, USED, MOE_FFN = 4, 2, 32
THETA = 500000.0


def llama3_rope_freqs(factor=8.0, low=1.0, high=4.0, original=8192):
    """LlamaModel.generate_extra_tensors of llama.cpp's convert_hf_to_gguf.py."""
    freqs = 1.0 / (THETA ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write(path, arch, rng, *, tied=False, rope_freqs=None, iq2=False, scaling_keys=None):
    w = GGUFWriter(path, arch)
    if scaling_keys is not None:
        factor, original = scaling_keys
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original)
    w.add_block_count(LAYERS)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    w.add_rope_dimension_count(HEAD_DIM)
    if arch == "qwen3moe":
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(USED)
        w.add_expert_feed_forward_length(MOE_FFN)
    add_tokenizer(w, "smollm" if arch == "llama" else "qwen2")

    def t(name, *shape, scale=0.3, offset=0.0):
        w.add_tensor(name, (offset + rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", VOCAB, HIDDEN, scale=1.0)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", HIDDEN, scale=0.1, offset=1.0)
        t(b + "attn_q.weight", q, HIDDEN)
        t(b + "attn_k.weight", kv, HIDDEN)
        t(b + "attn_v.weight", kv, HIDDEN)
        t(b + "attn_output.weight", HIDDEN, q)
        if arch.startswith("qwen3"):
            t(b + "attn_q_norm.weight", HEAD_DIM, scale=0.1, offset=1.0)
            t(b + "attn_k_norm.weight", HEAD_DIM, scale=0.1, offset=1.0)
        t(b + "ffn_norm.weight", HIDDEN, scale=0.1, offset=1.0)
        if arch == "qwen3moe":
            t(b + "ffn_gate_inp.weight", EXPERTS, HIDDEN, scale=1.0)
            t(b + "ffn_gate_exps.weight", EXPERTS, MOE_FFN, HIDDEN)
            t(b + "ffn_up_exps.weight", EXPERTS, MOE_FFN, HIDDEN)
            t(b + "ffn_down_exps.weight", EXPERTS, HIDDEN, MOE_FFN)
        else:
            t(b + "ffn_gate.weight", FFN, HIDDEN)
            if iq2 and i == 0:
                # One 256-value block per row (not the model's shape: the type is refused first).
                _, size = quants.GGML_QUANT_SIZES[T.IQ2_XXS]
                raw = rng.integers(0, 256, size=(FFN, size), dtype=np.uint8)
                w.add_tensor(b + "ffn_up.weight", raw, raw_dtype=T.IQ2_XXS)
            else:
                t(b + "ffn_up.weight", FFN, HIDDEN)
            t(b + "ffn_down.weight", HIDDEN, FFN)
    t("output_norm.weight", HIDDEN, scale=0.1, offset=1.0)
    if not tied:
        t("output.weight", VOCAB, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def kquant_blocks(rng, qtype, n=64):
    """Random raw blocks with sane float16 d (and dmin): every bit pattern of the rest."""
    _, size = quants.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    d = rng.uniform(-1e-2, 1e-2, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == T.Q2_K:  # scales[16], qs[64], d, dmin
        data[:, 80:82] = d
        data[:, 82:84] = rng.uniform(0, 1e-2, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    else:  # Q3_K: hmask[32], qs[64], scales[12], d
        data[:, 108:110] = d
    return data


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "kq"), exist_ok=True)
    rng = np.random.default_rng(77)
    freqs = llama3_rope_freqs()
    write(os.path.join(out, "llama3.gguf"), "llama", rng, rope_freqs=freqs)
    llama32 = llama3_rope_freqs(32.0)
    write(os.path.join(out, "llama32.gguf"), "llama", rng, rope_freqs=llama32, scaling_keys=(32.0, 8192))
    bad = freqs.copy()
    bad[HEAD_DIM // 4] *= 1.5
    write(os.path.join(out, "llama3_bad.gguf"), "llama", rng, rope_freqs=bad)
    write(os.path.join(out, "qwen3.gguf"), "qwen3", rng, tied=True)
    write(os.path.join(out, "qwen3moe.gguf"), "qwen3moe", rng)
    write(os.path.join(out, "iq2.gguf"), "llama", rng, iq2=True)
    for qtype in (T.Q2_K, T.Q3_K):
        data = kquant_blocks(rng, qtype)
        data.tofile(os.path.join(out, "kq", qtype.name + ".bin"))
        quants.dequantize(data, qtype).astype("<f4").tofile(os.path.join(out, "kq", qtype.name + ".f32"))


if __name__ == "__main__":
    main()

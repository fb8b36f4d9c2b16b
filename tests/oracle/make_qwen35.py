#!/usr/bin/env python3
"""Builds tiny random hybrid (gated DeltaNet + gated attention) test models for the mlx-gen oracle
tests (crates/cli/tests/qwen35.rs).

Usage: make_qwen35.py OUTDIR

One float32 checkpoint per architecture in Hugging Face layout, which mlx-lm's own Model classes
load through their `sanitize`:
  qwen3_next   4 layers, a full-attention layer every 2nd; fused in_proj_qkvz / in_proj_ba; MoE
               (8 experts, top-2, renormalised, a sigmoid-gated shared expert, one tensor per
               expert) on layers 0, 2 and 3, a dense MLP on layer 1 (`mlp_only_layers`)
  qwen3_5      4 layers, full attention on the 4th (the default interval); Hugging Face's
               multimodal layout (`model.language_model.`, a `text_config`, a vision tensor and an
               `mtp.` tensor that sanitize drops, conv1d as (C, 1, K), RMS norms as offsets from 1)
  qwen3_5_moe  3 layers, full attention on the 3rd; experts fused as `experts.gate_up_proj` /
               `experts.down_proj`, on every layer
All: 4 value heads over 2 key heads (the repeat), key head 32, value head 16, conv kernel 4;
attention 4 heads over 2 key/value heads, head_dim 32 (partial RoPE: 8 dims).
From each, with mlx-lm's own `mlx_lm.convert` (its Model classes and its save), a 4-bit group-32
float32 folder (as mlx-community publishes them: `language_model.` names, routers in 8 bits by the
quant_predicate), one of them in bfloat16, and for qwen3_5 an unquantized float32 MLX folder too.
Deterministic (fixed seeds). Writes OUTDIR/variants.json. Run with the oracle venv's python.
"""

import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_models import convert_quietly, script_main, write_float_variants  # noqa: E402

H, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 32, 96
NK, NV, DK, DV, KERNEL = 2, 4, 32, 16, 4
EXPERTS, MOE_INTER, SHARED_INTER = 8, 32, 48

FLOAT = [
    dict(name="qwen3next-f32", arch="qwen3_next", layers=4, interval=2),
    dict(name="qwen35-f32", arch="qwen3_5", layers=4, interval=4),
    dict(name="qwen35moe-f32", arch="qwen3_5_moe", layers=3, interval=3),
]
CONVERTED = [
    dict(name="qwen3next-q4g32", src="qwen3next-f32", quantize=True),
    dict(name="qwen35-q4g32", src="qwen35-f32", quantize=True),
    dict(name="qwen35moe-q4g32", src="qwen35moe-f32", quantize=True),
    dict(name="qwen35-mlx-f32", src="qwen35-f32", quantize=False),
    # As mlx-community publishes them: bfloat16 activations and scales (A_log stays float32).
    dict(name="qwen35moe-q4g32-bf16", src="qwen35moe-f32", quantize=True, dtype="bfloat16"),
]


def text_config(v, vocab, ids):
    c = {"vocab_size": vocab, "hidden_size": H, "num_hidden_layers": v["layers"], "num_attention_heads": HEADS,
         "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER, "rms_norm_eps": 1e-6,
         "linear_num_key_heads": NK, "linear_num_value_heads": NV, "linear_key_head_dim": DK,
         "linear_value_head_dim": DV, "linear_conv_kernel_dim": KERNEL, "full_attention_interval": v["interval"],
         "tie_word_embeddings": False, "max_position_embeddings": 512, "bos_token_id": ids["bos"],
         "eos_token_id": ids["eos"], "hidden_act": "silu", "torch_dtype": "float32"}
    if v["arch"] == "qwen3_next":
        c.update(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], num_experts=EXPERTS,
                 num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1], moe_intermediate_size=MOE_INTER,
                 shared_expert_intermediate_size=SHARED_INTER, norm_topk_prob=True, rope_theta=10000.0,
                 partial_rotary_factor=0.25)
        return c
    c.update(model_type=v["arch"] + "_text", rope_parameters={
        "rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True, "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25})
    if v["arch"] == "qwen3_5_moe":
        c.update(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
                 shared_expert_intermediate_size=SHARED_INTER, norm_topk_prob=True)
    return c


def make_config(v, vocab, ids):
    text = text_config(v, vocab, ids)
    if v["arch"] == "qwen3_next":
        return text
    arch = "Qwen3_5ForConditionalGeneration" if v["arch"] == "qwen3_5" else "Qwen3_5MoeForConditionalGeneration"
    return {"model_type": v["arch"], "architectures": [arch], "text_config": text, "tie_word_embeddings": False,
            "vision_config": {"depth": 1}, "bos_token_id": ids["bos"], "eos_token_id": ids["eos"]}


def make_weights(v, text, real_vocab, eos):
    rng = np.random.RandomState(zlib.crc32(v["name"].encode()) & 0x7FFFFFFF)
    V, arch, L = text["vocab_size"], v["arch"], v["layers"]

    def lin(out_dim, in_dim, gain=1.0):
        return (rng.standard_normal((out_dim, in_dim)) * gain / np.sqrt(in_dim)).astype(np.float32)

    def vec(n, scale=0.1):
        return (scale * rng.standard_normal(n)).astype(np.float32)

    def glu(p, inter):
        w[p + "gate_proj.weight"] = lin(inter, H, 1.5)
        w[p + "up_proj.weight"] = lin(inter, H, 1.5)
        w[p + "down_proj.weight"] = lin(H, inter, 1.5)

    base = "model." if arch == "qwen3_next" else "model.language_model."
    w = {}
    emb = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    emb[real_vocab:] = 0.0
    w[base + "embed_tokens.weight"] = emb
    key_dim, value_dim = NK * DK, NV * DV
    conv_dim = 2 * key_dim + value_dim
    for l in range(L):
        p = f"{base}layers.{l}."
        # Hugging Face stores these RMS norm weights as offsets from 1 (sanitize adds the 1).
        w[p + "input_layernorm.weight"] = vec(H)
        w[p + "post_attention_layernorm.weight"] = vec(H)
        if (l + 1) % v["interval"] != 0:
            a = p + "linear_attn."
            if arch == "qwen3_next":
                w[a + "in_proj_qkvz.weight"] = lin(2 * key_dim + 2 * value_dim, H, 2.0)
                w[a + "in_proj_ba.weight"] = lin(2 * NV, H, 2.0)
            else:
                w[a + "in_proj_qkv.weight"] = lin(conv_dim, H, 2.0)
                w[a + "in_proj_z.weight"] = lin(value_dim, H, 2.0)
                w[a + "in_proj_b.weight"] = lin(NV, H, 2.0)
                w[a + "in_proj_a.weight"] = lin(NV, H, 2.0)
            w[a + "conv1d.weight"] = (rng.standard_normal((conv_dim, 1, KERNEL)) * 0.5).astype(np.float32)
            w[a + "dt_bias"] = (1.0 + vec(NV)).astype(np.float32)
            w[a + "A_log"] = np.log(rng.uniform(1.0, 16.0, NV)).astype(np.float32)
            w[a + "norm.weight"] = (1.0 + vec(DV)).astype(np.float32)
            w[a + "out_proj.weight"] = lin(H, value_dim, 1.5)
        else:
            a = p + "self_attn."
            w[a + "q_proj.weight"] = lin(2 * HEADS * HEAD_DIM, H, 2.0)
            w[a + "k_proj.weight"] = lin(KV_HEADS * HEAD_DIM, H, 2.0)
            w[a + "v_proj.weight"] = lin(KV_HEADS * HEAD_DIM, H, 1.5)
            w[a + "o_proj.weight"] = lin(H, HEADS * HEAD_DIM, 1.5)
            w[a + "q_norm.weight"] = vec(HEAD_DIM)
            w[a + "k_norm.weight"] = vec(HEAD_DIM)
        m = p + "mlp."
        moe = arch == "qwen3_5_moe" or (arch == "qwen3_next" and l not in text["mlp_only_layers"])
        if not moe:
            glu(m, INTER)
            continue
        w[m + "gate.weight"] = lin(EXPERTS, H, 3.0)
        if arch == "qwen3_next":
            for e in range(EXPERTS):
                glu(m + f"experts.{e}.", MOE_INTER)
        else:
            gate = np.stack([lin(MOE_INTER, H, 1.5) for _ in range(EXPERTS)])
            up = np.stack([lin(MOE_INTER, H, 1.5) for _ in range(EXPERTS)])
            w[m + "experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
            w[m + "experts.down_proj"] = np.stack([lin(H, MOE_INTER, 1.5) for _ in range(EXPERTS)])
        glu(m + "shared_expert.", SHARED_INTER)
        w[m + "shared_expert_gate.weight"] = lin(1, H, 2.0)
    w[base + "norm.weight"] = vec(H)
    head = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    head[real_vocab:] = 0.0
    head[eos] *= 0.1  # rarely the argmax: 64 greedy tokens rather than an early stop
    w["lm_head.weight"] = head
    # What sanitize drops: the multi-token-prediction head, and (qwen3_5) the vision tower.
    w["mtp.fc.weight"] = lin(H, 2 * H)
    if arch != "qwen3_next":
        w["model.visual.patch_embed.proj.weight"] = lin(H, 12)
    return w


def config_and_weights(v, vocab, tok_size, ids):
    cfg = make_config(v, vocab, ids)
    return cfg, make_weights(v, cfg.get("text_config", cfg), tok_size, ids["eos"])


def write_converted(c, outdir):
    kw = dict(quantize=True, q_bits=4, q_group_size=32) if c["quantize"] else {}
    convert_quietly(outdir / c["src"], outdir / c["name"], dtype=c.get("dtype", "float32"), **kw)


def build(outdir, tokenizers, args):
    info = write_float_variants(outdir, tokenizers(), FLOAT, config_and_weights)
    for c in CONVERTED:
        write_converted(c, outdir)
        info[c["name"]] = dict(kind="quantized" if c["quantize"] else "mlx", arch=info[c["src"]]["arch"],
                               dtype=c.get("dtype", "float32"), src=c["src"])
    return info


if __name__ == "__main__":
    script_main(build)

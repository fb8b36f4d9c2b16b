#!/usr/bin/env python3
"""Builds tiny random mixture-of-experts test models for the mlx-gen oracle tests (crates/cli/tests/moe.rs).

Usage: make_moe.py OUTDIR

One float32 checkpoint per architecture in Hugging Face layout (one tensor per expert, Mixtral's
w1/w2/w3, mistral4's `kv_b_proj`), which mlx-lm's own `Model` classes load through their `sanitize`;
and from each, with mlx-lm's own `mlx_lm.convert` (its Model classes and its save), a 4-bit group-32
float32 MLX folder (and one bfloat16, as mlx-community publishes them; experts stacked into `switch_mlp`, mistral4's `kv_b_proj` split into
`embed_q`/`unembed_out`, qwen3_moe's routers in 8 bits by its quant_predicate, i.e. per-layer
overrides in config.json). What each exercises:
  qwen3_moe  8 experts, top-2, renormalised; head_dim 32 (4 x 32 != hidden 64, and wide enough for
             a quantized KV cache); `mlp_only_layers` and `decoder_sparse_step` mixing
             dense and MoE layers (the 4-bit one from a second float model with step 2)
  qwen2_moe  8 experts, top-2, a shared expert with its sigmoid `shared_expert_gate`
  mixtral    8 experts, top-2 softmax over the chosen logits, `block_sparse_moe`
  mistral4   MLA (q_lora, yarn rope, Llama-4 query scale over a short original context), a dense
             first layer, 8 experts in 4 groups (keep 2), top-2 renormalised and scaled, a shared expert;
             and once as published in FP8 (see FP8 below)
Deterministic (fixed seeds). Writes OUTDIR/variants.json. Run with the oracle venv's python.
"""

import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_deepseek import save_raw, to_fp8_blocks  # noqa: E402
from make_models import convert_quietly, padded_vocab, script_main, start_folder, write_float_variants  # noqa: E402

H, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, MOE_INTER, INTER = 64, 4, 2, 32, 8, 32, 96  # qwen3_moe's head_dim

FLOAT = [
    dict(name="qwen3moe-f32", arch="qwen3_moe", layers=3, step=1, mlp_only=[1]),
    dict(name="qwen3moe-step2-f32", arch="qwen3_moe", layers=4, step=2, mlp_only=[3]),
    dict(name="qwen2moe-f32", arch="qwen2_moe", layers=2),
    dict(name="mixtral-f32", arch="mixtral", layers=2),
    dict(name="mistral4-f32", arch="mistral4", layers=3),
]
QUANT = [
    dict(name="qwen3moe-q4g32", src="qwen3moe-step2-f32"),
    dict(name="qwen2moe-q4g32", src="qwen2moe-f32"),
    dict(name="mixtral-q4g32", src="mixtral-f32"),
    dict(name="mistral4-q4g32", src="mistral4-f32"),
    # As mlx-community publishes them: bfloat16 activations and scales.
    dict(name="qwen3moe-q4g32-bf16", src="qwen3moe-f32", dtype="bfloat16"),
]
KV_LORA, Q_LORA, NOPE, ROPE, VHEAD = 32, 32, 32, 32, 32
# mistral4 as published: FP8 (F8_E4M3) projections with 128x128 block scales, routed experts fused
# into `experts.gate_up_proj` / `experts.down_proj` with one scale per expert, an unused
# `activation_scale`; mlx-lm's sanitize dequantizes all of it to bfloat16.
FP8 = dict(name="mistral4-fp8", arch="mistral4", layers=3)


def make_config(v, vocab, ids):
    base = {"model_type": v["arch"], "vocab_size": vocab, "hidden_size": H, "num_hidden_layers": v["layers"],
            "num_attention_heads": HEADS, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "max_position_embeddings": 256, "torch_dtype": "float32", "hidden_act": "silu",
            "bos_token_id": ids["bos"], "eos_token_id": ids["eos"]}
    if v["arch"] == "qwen3_moe":
        base.update(architectures=["Qwen3MoeForCausalLM"], intermediate_size=INTER, num_key_value_heads=KV_HEADS,
                    head_dim=HEAD_DIM, num_experts=EXPERTS, num_experts_per_tok=2, decoder_sparse_step=v["step"],
                    mlp_only_layers=v["mlp_only"], moe_intermediate_size=MOE_INTER, norm_topk_prob=True,
                    rope_theta=10000.0)
    elif v["arch"] == "qwen2_moe":
        base.update(architectures=["Qwen2MoeForCausalLM"], intermediate_size=INTER, num_key_value_heads=KV_HEADS,
                    num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
                    shared_expert_intermediate_size=2 * MOE_INTER, rope_theta=1000000.0)
    elif v["arch"] == "mixtral":
        base.update(architectures=["MixtralForCausalLM"], intermediate_size=MOE_INTER, num_key_value_heads=KV_HEADS,
                    num_local_experts=EXPERTS, num_experts_per_tok=2, rope_theta=1000000.0)
    else:
        base.update(architectures=["Mistral4ForCausalLM"], intermediate_size=INTER, moe_intermediate_size=MOE_INTER,
                    num_key_value_heads=HEADS, n_shared_experts=1, n_routed_experts=EXPERTS,
                    routed_scaling_factor=1.5, kv_lora_rank=KV_LORA, q_lora_rank=Q_LORA, norm_topk_prob=True,
                    topk_group=2, n_group=4, num_experts_per_tok=2, first_k_dense_replace=1,
                    qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=VHEAD,
                    rope_parameters={"type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1,
                                     "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})
    return base


def make_weights(v, cfg, real_vocab):
    rng = np.random.RandomState(zlib.crc32(v["name"].encode()) & 0x7FFFFFFF)
    V, arch = cfg["vocab_size"], v["arch"]

    def lin(out_dim, in_dim, gain=1.0):
        return (rng.standard_normal((out_dim, in_dim)) * gain / np.sqrt(in_dim)).astype(np.float32)

    def vec(n, scale=0.1):
        return (scale * rng.standard_normal(n)).astype(np.float32)

    def norm(n):
        return (1.0 + vec(n)).astype(np.float32)

    def glu(p, inter, names=("gate_proj", "up_proj", "down_proj")):
        w[p + names[0] + ".weight"] = lin(inter, H, 1.5)
        w[p + names[1] + ".weight"] = lin(inter, H, 1.5)
        w[p + names[2] + ".weight"] = lin(H, inter, 1.5)

    w = {}
    emb = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    emb[real_vocab:] = 0.0
    w["model.embed_tokens.weight"] = emb
    for l in range(v["layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        a = p + "self_attn."
        if arch == "mistral4":
            w[a + "q_a_proj.weight"] = lin(Q_LORA, H, 1.5)
            w[a + "q_a_layernorm.weight"] = norm(Q_LORA)
            w[a + "q_b_proj.weight"] = lin(HEADS * (NOPE + ROPE), Q_LORA, 2.0)
            w[a + "kv_a_proj_with_mqa.weight"] = lin(KV_LORA + ROPE, H, 2.0)
            w[a + "kv_a_layernorm.weight"] = norm(KV_LORA)
            w[a + "kv_b_proj.weight"] = lin(HEADS * (NOPE + VHEAD), KV_LORA, 2.0)
            w[a + "o_proj.weight"] = lin(H, HEADS * VHEAD, 1.5)
        else:
            hd = HEAD_DIM if arch == "qwen3_moe" else H // HEADS
            w[a + "q_proj.weight"] = lin(HEADS * hd, H, 2.0)
            w[a + "k_proj.weight"] = lin(KV_HEADS * hd, H, 2.0)
            w[a + "v_proj.weight"] = lin(KV_HEADS * hd, H, 1.5)
            w[a + "o_proj.weight"] = lin(H, HEADS * hd, 1.5)
            if arch == "qwen2_moe":
                for n, k in [("q_proj", HEADS), ("k_proj", KV_HEADS), ("v_proj", KV_HEADS)]:
                    w[a + n + ".bias"] = vec(k * hd, 0.5)
            if arch == "qwen3_moe":
                w[a + "q_norm.weight"] = norm(hd)
                w[a + "k_norm.weight"] = norm(hd)
        if arch == "mixtral":
            m = p + "block_sparse_moe."
            w[m + "gate.weight"] = lin(EXPERTS, H, 3.0)
            for e in range(EXPERTS):
                glu(m + f"experts.{e}.", MOE_INTER, ("w1", "w3", "w2"))
            continue
        m = p + "mlp."
        dense = (arch == "qwen3_moe" and (l in v["mlp_only"] or (l + 1) % v["step"] != 0)) or (
            arch == "mistral4" and l < cfg["first_k_dense_replace"])
        if dense:
            glu(m, INTER)
            continue
        w[m + "gate.weight"] = lin(EXPERTS, H, 3.0)
        for e in range(EXPERTS):
            glu(m + f"experts.{e}.", MOE_INTER)
        if arch == "qwen2_moe":
            glu(m + "shared_expert.", 2 * MOE_INTER)
            w[m + "shared_expert_gate.weight"] = lin(1, H, 2.0)
        if arch == "mistral4":
            glu(m + "shared_experts.", MOE_INTER)
    w["model.norm.weight"] = norm(H)
    head = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    head[real_vocab:] = 0.0
    w["lm_head.weight"] = head
    return w


def config_and_weights(v, vocab, tok_size, ids):
    cfg = make_config(v, vocab, ids)
    return cfg, make_weights(v, cfg, tok_size)


def to_fp8_per_expert(w):
    """w (E, m, n) float32 -> (e4m3 bytes (E, m, n) uint8, scale_inv (E, 1, 1) float32)."""
    import mlx.core as mx

    scale = (np.maximum(np.abs(w).max(axis=(1, 2), keepdims=True), 1e-8) / 448.0).astype(np.float32)
    return np.array(mx.to_fp8(mx.array((w / scale).astype(np.float32)))), scale


def write_fp8(v, outdir, tokdir, tok_size, ids):
    cfg = make_config(v, padded_vocab(tok_size), ids)
    w = make_weights(v, cfg, tok_size)
    tensors = {}
    for l in range(v["layers"]):
        p = f"model.layers.{l}.mlp."
        if p + "experts.0.gate_proj.weight" not in w:
            continue
        stack = lambda n: np.stack([w.pop(p + f"experts.{e}.{n}.weight") for e in range(EXPERTS)])  # noqa: E731
        gate, up, down = stack("gate_proj"), stack("up_proj"), stack("down_proj")
        for name, x in [("gate_up_proj", np.concatenate([gate, up], axis=1)), ("down_proj", down)]:
            q, s = to_fp8_per_expert(x)
            tensors[p + "experts." + name] = (q, "F8_E4M3")
            tensors[p + "experts." + name + "_scale_inv"] = (s, "F32")
    proj = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for k, x in w.items():
        if k.endswith(".weight") and k.split(".")[-2] in proj:
            q, s = to_fp8_blocks(x)
            tensors[k] = (q, "F8_E4M3")
            tensors[k + "_scale_inv"] = (s, "F32")
            if k.endswith("q_a_proj.weight"):
                tensors[k[: -len("weight")] + "activation_scale"] = (np.ones((), np.float32), "F32")
        else:
            tensors[k] = (x, "F32")
    cfg["quantization_config"] = {"activation_scheme": "static", "quant_method": "fp8", "weight_block_size": [128, 128]}
    d = start_folder(outdir / v["name"], cfg, tokdir)
    save_raw(d / "model.safetensors", tensors)


def write_quant(q, outdir):
    convert_quietly(outdir / q["src"], outdir / q["name"], quantize=True, q_bits=4, q_group_size=32,
                    dtype=q.get("dtype", "float32"))


def build(outdir, tokenizers, args):
    tokdir, tok_size, ids = tok = tokenizers()
    info = write_float_variants(outdir, tok, FLOAT, config_and_weights)
    write_fp8(FP8, outdir, tokdir, tok_size, ids)
    info[FP8["name"]] = dict(kind="fp8", arch="mistral4", dtype="float32")
    for q in QUANT:
        write_quant(q, outdir)
        info[q["name"]] = dict(kind="quantized", arch=info[q["src"]]["arch"], dtype=q.get("dtype", "float32"), bits=4,
                               group_size=32, src=q["src"])
    return info


if __name__ == "__main__":
    script_main(build)

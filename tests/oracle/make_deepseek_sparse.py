#!/usr/bin/env python3
"""Builds tiny random DeepSeek sparse-attention (deepseek_v32, deepseek_v41) test models for the
mlx-gen oracle tests (crates/cli/tests/deepseek_sparse.rs).

Usage: make_deepseek_sparse.py OUTDIR

deepseek_v32: DeepSeek-V3's MLA and experts (layer 0 dense, then MoE layers: 8 routed experts in 2
groups, top-2, a shared expert) with the lightning indexer, whose `index_topk` (16, or 8) is below
the prompt lengths and the 64 generated tokens, so that prefill and decode both attend sparsely.
Float variants are written Hugging Face style (one tensor per expert, `kv_b_proj`); from the main one
mlx-lm's own `mlx_lm.convert` makes 4-bit group-32 float32 and bfloat16 folders (the router bias
kept float32 by its cast_predicate) and a mixed one (layer 1's MLP at 8 bits: per-layer overrides
in config.json). One checkpoint as DeepSeek publishes V3.2: FP8
(`F8_E4M3`) projections, the indexer's included, with float32 128x128 `weight_scale_inv` block
scales, plus a multi-token-prediction layer (index num_hidden_layers) that sanitize drops.
deepseek_v41: mlx-lm's own `Model` with every parameter random (MLX names, config under
`text_config` as published): hyper-connection streams, window-only layers beside compressing ones
(ratios 4 and 1, a layer that reads another's compressed KV and index keys), the indexer's top-k
below the number of groups, candidate blocks on one variant; float32, mlx-lm's 4-bit conversion, and
as DeepSeek publishes it (its names, FP8 projections with 32x32 tile scales, FP4 experts).
Deterministic (fixed seeds). Writes OUTDIR/variants.json. Run with the oracle venv's python.
"""

import json
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_deepseek import save_raw, to_fp8_blocks  # noqa: E402
from make_models import (  # noqa: E402
    convert_quietly, copy_tokenizer, fresh_dir, padded_vocab, script_main, start_folder, write_float_folder,
    write_json)

HIDDEN, INTER, MOE_INTER, HEADS, LAYERS = 64, 96, 32, 4, 3
KV_LORA, NOPE, ROPE, VHEAD, Q_LORA = 32, 32, 32, 32, 32
INDEX_HEADS, INDEX_DIM = 4, 64

V32 = [
    # YaRN rope, the indexer's rope not interleaved (the default), top-16 keys.
    dict(name="dsv32-f32", topk=16, interleave=False, yarn=True),
    # Plain rope, the indexer's rope interleaved, top-8 keys.
    dict(name="dsv32-interleave-f32", topk=8, interleave=True, yarn=False),
]
FP8 = dict(name="dsv32-fp8", topk=16, interleave=False, yarn=True)


def v32_config(v, vocab_size, ids):
    cfg = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "moe_intermediate_size": MOE_INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": KV_LORA,
        "q_lora_rank": Q_LORA,
        "qk_rope_head_dim": ROPE,
        "v_head_dim": VHEAD,
        "qk_nope_head_dim": NOPE,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": 2,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "index_head_dim": INDEX_DIM,
        "index_n_heads": INDEX_HEADS,
        "index_topk": v["topk"],
        "indexer_rope_interleave": v["interleave"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
    }
    if v["yarn"]:
        cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    return cfg


def v32_weights(v, cfg, real_vocab, mtp=False):
    rng = np.random.RandomState(zlib.crc32(v["name"].encode()) & 0x7FFFFFFF)
    V, H = cfg["vocab_size"], HIDDEN

    def lin(out_dim, in_dim, gain=1.0):
        return (rng.standard_normal((out_dim, in_dim)) * gain / np.sqrt(in_dim)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def mlp(p, inter):
        w[p + "gate_proj.weight"] = lin(inter, H, 1.5)
        w[p + "up_proj.weight"] = lin(inter, H, 1.5)
        w[p + "down_proj.weight"] = lin(H, inter, 1.5)

    w = {}
    emb = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    emb[real_vocab:] = 0.0
    w["model.embed_tokens.weight"] = emb
    for l in range(LAYERS + (1 if mtp else 0)):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        a = p + "self_attn."
        w[a + "q_a_proj.weight"] = lin(Q_LORA, H, 1.5)
        w[a + "q_a_layernorm.weight"] = norm(Q_LORA)
        w[a + "q_b_proj.weight"] = lin(HEADS * (NOPE + ROPE), Q_LORA, 2.0)
        w[a + "kv_a_proj_with_mqa.weight"] = lin(KV_LORA + ROPE, H, 2.0)
        w[a + "kv_a_layernorm.weight"] = norm(KV_LORA)
        w[a + "kv_b_proj.weight"] = lin(HEADS * (NOPE + VHEAD), KV_LORA, 2.0)
        w[a + "o_proj.weight"] = lin(H, HEADS * VHEAD, 1.5)
        i = a + "indexer."
        w[i + "wq_b.weight"] = lin(INDEX_HEADS * INDEX_DIM, Q_LORA, 2.0)
        w[i + "wk.weight"] = lin(INDEX_DIM, H, 2.0)
        w[i + "k_norm.weight"] = norm(INDEX_DIM)
        w[i + "k_norm.bias"] = (0.1 * rng.standard_normal(INDEX_DIM)).astype(np.float32)
        w[i + "weights_proj.weight"] = lin(INDEX_HEADS, H, 2.0)
        if l < cfg["first_k_dense_replace"]:
            mlp(p + "mlp.", INTER)
            continue
        w[p + "mlp.gate.weight"] = lin(8, H, 3.0)
        w[p + "mlp.gate.e_score_correction_bias"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
        for e in range(8):
            mlp(p + f"mlp.experts.{e}.", MOE_INTER)
        mlp(p + "mlp.shared_experts.", MOE_INTER)
    w["model.norm.weight"] = norm(H)
    head = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    head[real_vocab:] = 0.0
    w["lm_head.weight"] = head
    return w


V41 = [
    # YaRN on the compressing layers, sqrt-softplus routing, candidate blocks chosen by layer 1.
    dict(name="dsv41-f32", hc_mult=2, iters=3, window=8, ratios=[0, 4, 4, 0], kv=[1, 2], index=[1, 2],
         candidate=1, topk=4, scoring="sqrtsoftplus", yarn=True),
    # No YaRN, sigmoid routing, no candidates; layer 3 indexes layer 0's groups and attends over layer
    # 2's per-token (ratio 1) compressed KV.
    dict(name="dsv41-sigmoid-f32", hc_mult=3, iters=2, window=6, ratios=[4, 0, 1, 4], kv=[0, 2], index=[0, 3],
         candidate=-1, topk=3, scoring="sigmoid", yarn=False),
]


def v41_config(v, vocab_size, ids):
    text = dict(model_type="deepseek_v41", vocab_size=vocab_size, hidden_size=64, num_hidden_layers=4,
                num_attention_heads=4, head_dim=64, q_lora_rank=32, qk_rope_head_dim=16, o_groups=2,
                o_lora_rank=32, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                scoring_func=v["scoring"], routed_scaling_factor=1.5, swiglu_limit=10.0, rms_norm_eps=1e-6,
                sliding_window=v["window"], compress_ratios=v["ratios"], kv_source_layer_ids=v["kv"],
                index_source_layer_ids=v["index"], compress_rope_theta=160000.0,
                candidate_source_layer_id=v["candidate"], candidate_topk_blocks=2, candidate_block_size=4,
                index_n_heads=2, index_head_dim=32, index_topk=v["topk"], rope_theta=10000.0,
                max_position_embeddings=1024, hc_mult=v["hc_mult"], hc_sinkhorn_iters=v["iters"], hc_eps=1e-6,
                tie_word_embeddings=False)
    if v["yarn"]:
        text["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                "beta_fast": 32, "beta_slow": 1}
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": text,
            "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"]}


def v41_weights(v, cfg):
    """mlx-lm's own module tree, every parameter random: norms and mixer scales near 1, matrices
    scaled by their fan-in, vectors (biases, sinks) small."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import deepseek_v41

    model = deepseek_v41.Model(deepseek_v41.ModelArgs.from_dict(cfg))
    rng = np.random.RandomState(zlib.crc32(v["name"].encode()) & 0x7FFFFFFF)
    w = {}
    for k, p in tree_flatten(model.parameters()):
        if k.endswith("norm.weight") or "layernorm" in k or k.endswith("_hc.scale"):
            a = 1.0 + 0.1 * rng.standard_normal(p.shape)
        elif p.ndim >= 2:
            a = rng.standard_normal(p.shape) * 1.5 / np.sqrt(p.shape[-1])
        else:
            a = 0.3 * rng.standard_normal(p.shape)
        w[k] = mx.array(a.astype(np.float32))
    return w


def v41_published_name(key):
    """The DeepSeek checkpoint name of an MLX deepseek_v41 tensor (the inverse of mlx-lm's `_rename`)."""
    if key == "lm_head.weight":
        return "head.weight"
    if key == "model.embed_tokens.weight":
        return "embed.weight"
    key = key.removeprefix("model.")
    for mlx_name, name in [(".self_attn.", ".attn."), (".mlp.", ".ffn."), (".input_layernorm.", ".attn_norm."),
                           (".post_attention_layernorm.", ".ffn_norm."), (".attn_hc.", ".hc_attn_"),
                           (".ffn_hc.", ".hc_ffn_"), (".sinks", ".attn_sink"), (".q_a_proj.", ".wq_a."),
                           (".compressor.kv_norm.", ".compressor.norm."), (".compressor.kv_proj.", ".compressor.wkv."),
                           (".compressor.gate_proj.", ".compressor.wgate."), (".indexer.k_proj.", ".indexer.wk."),
                           (".indexer.q_b_proj.", ".indexer.wq_b."), (".attn.q_b_proj.", ".attn.wq_b."),
                           (".attn.kv_proj.", ".attn.wkv."), (".o_a_proj.", ".wo_a."), (".o_b_proj.", ".wo_b."),
                           (".q_a_norm.", ".q_norm."), (".gate.e_score_correction_bias", ".gate.bias"),
                           (".shared_experts.gate_proj.", ".shared_experts.w1."),
                           (".shared_experts.down_proj.", ".shared_experts.w2."),
                           (".shared_experts.up_proj.", ".shared_experts.w3.")]:
        key = key.replace(mlx_name, name)
    return key


def write_v41_published(v, src, d):
    """deepseek_v41 as DeepSeek publishes it: its own tensor names, FP8 (e4m3) projections with one
    float32 power-of-two scale per 32x32 tile (`X.scale`), and the routed experts per expert in FP4
    (e2m1, two per byte) with ue8m0 scales per 32 inputs (uint8); mlx-lm's sanitize keeps both packed
    (mxfp8 / mxfp4)."""
    import mlx.core as mx

    tensors = {}
    for k, w in mx.load(str(src / "model.safetensors")).items():
        name = v41_published_name(k)
        w = np.array(w)
        if ".switch_mlp." in k:
            proj = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[k.split(".")[-2]]
            layer = k.split(".")[2]
            for e in range(w.shape[0]):
                q, s, *_ = mx.quantize(mx.array(w[e]), group_size=32, bits=4, mode="mxfp4")
                base = f"layers.{layer}.ffn.experts.{e}.{proj}"
                tensors[base + ".weight"] = (np.array(q.view(mx.int8)), "I8")
                tensors[base + ".scale"] = (np.array(s), "U8")
        elif k.endswith(".weight") and w.ndim >= 2 and (".self_attn." in k or ".shared_experts." in k) and "norm" not in k:
            w2 = w.reshape(-1, w.shape[-1])  # o_a_proj: its groups one after another
            m, n = w2.shape
            pm = -m % 32
            tiles = np.pad(w2, ((0, pm), (0, 0))).reshape((m + pm) // 32, 32, n // 32, 32)
            amax = np.maximum(np.abs(tiles).max(axis=(1, 3)), 1e-8)
            scale = np.power(2.0, np.ceil(np.log2(amax / 448.0))).astype(np.float32)
            q = (tiles / scale[:, None, :, None]).reshape(m + pm, n)[:m]
            tensors[name] = (np.array(mx.to_fp8(mx.array(q.astype(np.float32)))), "F8_E4M3")
            tensors[name.removesuffix(".weight") + ".scale"] = (scale, "F32")
        else:
            tensors[name] = (w.astype(np.float32), "F32")
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                  "weight_block_size": [32, 32], "activation_scheme": "dynamic"}
    write_json(d / "config.json", cfg)
    save_raw(d / "model.safetensors", tensors)


def is_fp8_projection(name):
    """The Linear weights DeepSeek publishes in FP8: attention (the indexer's wq_b and wk too) and MLP
    projections, not the router, the norms, the indexer's head weights, the embedding or the head."""
    proj = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "wq_b", "wk",
            "gate_proj", "up_proj", "down_proj")
    return name.endswith(".weight") and name.split(".")[-2] in proj


def mixed_predicate(path, module):
    if ".layers.1.mlp." in path:
        return {"group_size": 32, "bits": 8, "mode": "affine"}
    return True


def build(outdir, tokenizers, args):
    tokdir, tok_size, ids = tokenizers()
    vocab = padded_vocab(tok_size)
    info = {}
    for v in V32:
        cfg = v32_config(v, vocab, ids)
        write_float_folder(outdir / v["name"], cfg, v32_weights(v, cfg, tok_size), tokdir)
        info[v["name"]] = dict(kind="float", arch="deepseek_v32", dtype="float32")
    src = outdir / "dsv32-f32"
    for name, dtype, pred in [("dsv32-q4g32", "float32", None), ("dsv32-q4g32-bf16", "bfloat16", None),
                              ("dsv32-mixed", "float32", mixed_predicate)]:
        convert_quietly(src, outdir / name, quantize=True, q_bits=4, q_group_size=32, dtype=dtype,
                        quant_predicate=pred)
        info[name] = dict(kind="mixed" if pred else "quantized", arch="deepseek_v32", dtype=dtype, bits=4,
                          group_size=32, src="dsv32-f32")

    for v in V41:
        cfg = v41_config(v, vocab, ids)
        write_float_folder(outdir / v["name"], cfg, v41_weights(v, cfg), tokdir, fmt="mlx")
        info[v["name"]] = dict(kind="float", arch="deepseek_v41", dtype="float32")
    convert_quietly(outdir / "dsv41-f32", outdir / "dsv41-q4g32", quantize=True, q_bits=4, q_group_size=32,
                    dtype="float32")
    info["dsv41-q4g32"] = dict(kind="quantized", arch="deepseek_v41", dtype="float32", bits=4, group_size=32,
                               src="dsv41-f32")
    d = fresh_dir(outdir / "dsv41-fp8")
    write_v41_published(V41[0], outdir / "dsv41-f32", d)
    copy_tokenizer(tokdir, d)
    info["dsv41-fp8"] = dict(kind="fp8", arch="deepseek_v41", dtype="float32")

    cfg = v32_config(FP8, vocab, ids)
    tensors = {}
    for k, w in v32_weights(FP8, cfg, tok_size, mtp=True).items():
        if is_fp8_projection(k):
            q, s = to_fp8_blocks(w)
            tensors[k] = (q, "F8_E4M3")
            tensors[k + "_scale_inv"] = (s, "F32")
        else:
            tensors[k] = (w, "F32")
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [128, 128]}
    d = start_folder(outdir / FP8["name"], cfg, tokdir)
    save_raw(d / "model.safetensors", tensors)
    info[FP8["name"]] = dict(kind="fp8", arch="deepseek_v32", dtype="float32")
    return info


if __name__ == "__main__":
    script_main(build)

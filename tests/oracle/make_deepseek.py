#!/usr/bin/env python3
"""Builds tiny random DeepSeek-V2/V3 test models for the mlx-gen oracle tests (crates/cli/tests/deepseek.rs).

Usage: make_deepseek.py OUTDIR

Float variants are written Hugging Face style (one tensor per expert, `kv_b_proj`, `lm_head`); the
4-bit variants come from mlx-lm's own `mlx_lm.convert` of a float one (so experts are stacked into
`switch_mlp` and V3's `kv_b_proj` is split into `embed_q`/`unembed_out`, as mlx-lm saves them).
4-bit bfloat16 conversions of one V2 and one V3 variant, and a V3 checkpoint whose only quantized
layer is `kv_b_proj` (as older mlx-lm conversions have it). Two V3 checkpoints in published Hugging
Face formats that mlx-lm's sanitize converts: FP8 (`F8_E4M3` weights with float32 128x128
`weight_scale_inv` block scales, some dimensions not multiples of 128; dequantized to bfloat16 at
load) and compressed-tensors int4 experts (`weight_packed`/`weight_scale`/`weight_shape`). Every variant: several routed experts, 2 shared experts, group-limited routing, layer 0 dense and
the next ones mixture-of-experts, YaRN rope. Deterministic (fixed seeds). Writes OUTDIR/variants.json.
Run with the oracle venv's python (scripts/oracle-venv.sh).
"""

import json
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_models import (  # noqa: E402
    convert_quietly, fresh_dir, padded_vocab, script_main, start_folder, write_float_variants, write_json)

FLOAT = [
    # V2: no q_lora, group_limited_greedy (4 groups of 2, keep 2), yarn with mscale != mscale_all_dim.
    dict(name="dsv2-f32", arch="deepseek_v2", q_lora=None, experts=8, top_k=2, n_group=4, topk_group=2,
         scaling=1.5, mscale=1.0, mscale_all_dim=0.707),
    # V2 with a low-rank query path (48: not a multiple of the 32 group, so q_b_proj stays float).
    dict(name="dsv2-qlora-f32", arch="deepseek_v2", q_lora=48, experts=8, top_k=3, n_group=2, topk_group=1,
         scaling=1.0, mscale=0.707, mscale_all_dim=0.707),
    # V3: low-rank query, sigmoid routing with correction bias, 4 groups keep 2, normalised top-3.
    dict(name="dsv3-f32", arch="deepseek_v3", q_lora=32, experts=8, top_k=3, n_group=4, topk_group=2,
         scaling=2.5, mscale=1.0, mscale_all_dim=1.0, inv_freq=True),
    # V3 without q_lora, top-2, yarn ratio != 1.
    dict(name="dsv3-noqlora-f32", arch="deepseek_v3", q_lora=None, experts=8, top_k=2, n_group=2,
         topk_group=1, scaling=1.0, mscale=1.0, mscale_all_dim=0.8),
]

# Made by mlx_lm.convert from a float variant (MLX's CPU gather_mm takes float32 only, so the
# bfloat16 ones are quantized: gather_qmm takes bfloat16).
QUANT = [
    dict(name="dsv2-q4g32", src="dsv2-f32", bits=4, group=32, dtype="float32"),
    dict(name="dsv3-q4g32", src="dsv3-f32", bits=4, group=32, dtype="float32"),
    dict(name="dsv2-q4g32-bf16", src="dsv2-qlora-f32", bits=4, group=32, dtype="bfloat16"),
    dict(name="dsv3-q4g32-bf16", src="dsv3-f32", bits=4, group=32, dtype="bfloat16"),
]

# An older mlx-lm V3 conversion: HF layout with only `kv_b_proj` quantized (4 bits, group 32), which
# mlx-lm's sanitize dequantizes, splits and quantizes again.
KVB_QUANT = dict(name="dsv3-kvb-q4g32", src="dsv3-noqlora-f32", bits=4, group=32)

# Published formats (see above): the FP8 one has a 200-wide dense MLP (two 128-blocks, the second
# partial) and FP8 experts; the int4 one has float attention and int4 routed and shared experts.
FP8 = dict(name="dsv3-fp8", arch="deepseek_v3", q_lora=32, experts=8, top_k=3, n_group=4, topk_group=2,
           scaling=2.5, mscale=1.0, mscale_all_dim=1.0, inter=200)
INT4 = dict(name="dsv3-int4", arch="deepseek_v3", q_lora=None, experts=8, top_k=2, n_group=2, topk_group=1,
            scaling=1.0, mscale=1.0, mscale_all_dim=0.8)

HIDDEN, INTER, MOE_INTER, HEADS, LAYERS = 64, 96, 32, 4, 3
KV_LORA, NOPE, ROPE, VHEAD = 32, 32, 32, 32  # V2 keys: 64 wide, so 32-groups quantize them


def make_config(v, vocab_size, ids):
    v3 = v["arch"] == "deepseek_v3"
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": v["arch"],
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": v.get("inter", INTER),
        "moe_intermediate_size": MOE_INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_shared_experts": 2,
        "n_routed_experts": v["experts"],
        "routed_scaling_factor": v["scaling"],
        "kv_lora_rank": KV_LORA,
        "q_lora_rank": v["q_lora"],
        "qk_rope_head_dim": ROPE,
        "v_head_dim": VHEAD,
        "qk_nope_head_dim": NOPE,
        "topk_method": "noaux_tc" if v3 else "group_limited_greedy",
        "n_group": v["n_group"],
        "topk_group": v["topk_group"],
        "num_experts_per_tok": v["top_k"],
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": v["mscale"],
            "mscale_all_dim": v["mscale_all_dim"],
        },
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
    }
    if v3:
        cfg["scoring_func"] = "sigmoid"
        cfg["norm_topk_prob"] = True
    else:
        cfg["scoring_func"] = "softmax"
    return cfg


def make_weights(v, cfg, real_vocab):
    rng = np.random.RandomState(zlib.crc32(v["name"].encode()) & 0x7FFFFFFF)
    V, H = cfg["vocab_size"], HIDDEN
    qhd = NOPE + ROPE

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
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        a = p + "self_attn."
        if v["q_lora"] is None:
            w[a + "q_proj.weight"] = lin(HEADS * qhd, H, 2.0)
        else:
            w[a + "q_a_proj.weight"] = lin(v["q_lora"], H, 1.5)
            w[a + "q_a_layernorm.weight"] = norm(v["q_lora"])
            w[a + "q_b_proj.weight"] = lin(HEADS * qhd, v["q_lora"], 2.0)
        w[a + "kv_a_proj_with_mqa.weight"] = lin(KV_LORA + ROPE, H, 2.0)
        w[a + "kv_a_layernorm.weight"] = norm(KV_LORA)
        w[a + "kv_b_proj.weight"] = lin(HEADS * (NOPE + VHEAD), KV_LORA, 2.0)
        w[a + "o_proj.weight"] = lin(H, HEADS * VHEAD, 1.5)
        if v.get("inv_freq"):
            w[a + "rotary_emb.inv_freq"] = (1.0 / (10000.0 ** (np.arange(0, ROPE, 2) / ROPE))).astype(np.float32)
        if l < cfg["first_k_dense_replace"]:
            mlp(p + "mlp.", v.get("inter", INTER))
            continue
        w[p + "mlp.gate.weight"] = lin(v["experts"], H, 3.0)
        if v["arch"] == "deepseek_v3":
            w[p + "mlp.gate.e_score_correction_bias"] = (0.1 * rng.standard_normal(v["experts"])).astype(np.float32)
        for e in range(v["experts"]):
            mlp(p + f"mlp.experts.{e}.", MOE_INTER)
        mlp(p + "mlp.shared_experts.", MOE_INTER * 2)
    w["model.norm.weight"] = norm(H)
    head = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    head[real_vocab:] = 0.0
    w["lm_head.weight"] = head
    return w


def config_and_weights(v, vocab, tok_size, ids):
    cfg = make_config(v, vocab, ids)
    return cfg, make_weights(v, cfg, tok_size)


def write_quant(q, outdir):
    convert_quietly(outdir / q["src"], outdir / q["name"], quantize=True, q_bits=q["bits"], q_group_size=q["group"],
                    dtype=q["dtype"])


def write_kvb_quant(q, outdir):
    import mlx.core as mx

    src, dst = outdir / q["src"], fresh_dir(outdir / q["name"], create=False)
    shutil.copytree(src, dst)
    weights = mx.load(str(src / "model.safetensors"))
    out = {}
    for k, w in weights.items():
        if k.endswith("kv_b_proj.weight"):
            base = k[: -len("weight")]
            out[base + "weight"], out[base + "scales"], out[base + "biases"] = mx.quantize(
                w, group_size=q["group"], bits=q["bits"])
        else:
            out[k] = w
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization"] = {"group_size": q["group"], "bits": q["bits"]}
    write_json(dst / "config.json", cfg)


def save_raw(path, tensors):
    """A safetensors file from {name: (numpy array, safetensors dtype)}, so that uint8 data can be
    labelled F8_E4M3 as published FP8 checkpoints have it (MLX reads it back as uint8)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a, dtype = tensors[name]
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def is_projection(name):
    """The Linear weights DeepSeek-V3 publishes in FP8: attention and MLP projections (not the router,
    the norms, the embedding or the head)."""
    proj = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
            "gate_proj", "up_proj", "down_proj")
    return name.endswith(".weight") and name.split(".")[-2] in proj


def to_fp8_blocks(w, bs=128):
    """w (m, n) float32 -> (e4m3 bytes (m, n) uint8, scale_inv (ceil(m/bs), ceil(n/bs)) float32)."""
    import mlx.core as mx

    m, n = w.shape
    pm, pn = -m % bs, -n % bs
    blocks = np.pad(w, ((0, pm), (0, pn))).reshape((m + pm) // bs, bs, (n + pn) // bs, bs)
    scale = (np.maximum(np.abs(blocks).max(axis=(1, 3)), 1e-8) / 448.0).astype(np.float32)
    q = (blocks / scale[:, None, :, None]).reshape(m + pm, n + pn)[:m, :n].astype(np.float32)
    return np.array(mx.to_fp8(mx.array(q))), scale


def to_packed_int4(w, group=32):
    """Symmetric int4 as compressed-tensors packs it: (int32 (out, in/8) of 4-bit q + 8, low bits
    first; float32 scales (out, in/group))."""
    out_dims, in_dims = w.shape
    g = w.reshape(out_dims, in_dims // group, group)
    scale = (np.abs(g).max(-1) / 7.0).astype(np.float32)
    q = (np.clip(np.round(g / scale[..., None]), -8, 7).astype(np.int64) + 8).reshape(out_dims, in_dims // 8, 8)
    packed = np.zeros((out_dims, in_dims // 8), dtype=np.uint64)
    for i in range(8):
        packed |= q[..., i].astype(np.uint64) << np.uint64(4 * i)
    return packed.astype(np.uint32).view(np.int32), scale


def write_published(v, outdir, tokdir, tok_size, ids):
    cfg = make_config(v, padded_vocab(tok_size), ids)
    tensors = {}
    for k, w in make_weights(v, cfg, tok_size).items():
        if v is FP8 and is_projection(k):
            q, s = to_fp8_blocks(w)
            tensors[k] = (q, "F8_E4M3")
            tensors[k + "_scale_inv"] = (s, "F32")
        elif v is INT4 and is_projection(k) and (".mlp.experts." in k or ".mlp.shared_experts." in k):
            base = k[: -len("weight")]
            packed, s = to_packed_int4(w)
            tensors[base + "weight_packed"] = (packed, "I32")
            tensors[base + "weight_scale"] = (s, "F32")
            tensors[base + "weight_shape"] = (np.array(w.shape, dtype=np.int64), "I64")
        else:
            tensors[k] = (w, "F32")
    if v is FP8:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": [128, 128]}
    else:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}},
            "ignore": ["lm_head"],
        }
    d = start_folder(outdir / v["name"], cfg, tokdir)
    save_raw(d / "model.safetensors", tensors)


def build(outdir, tokenizers, args):
    tokdir, tok_size, ids = tok = tokenizers()
    info = write_float_variants(outdir, tok, FLOAT, config_and_weights)
    for q in QUANT:
        write_quant(q, outdir)
        info[q["name"]] = dict(kind="quantized", arch=info[q["src"]]["arch"],
                               dtype=q["dtype"], bits=q["bits"], group_size=q["group"], src=q["src"])
    q = KVB_QUANT
    write_kvb_quant(q, outdir)
    info[q["name"]] = dict(kind="quantized", arch="deepseek_v3", dtype="float32", bits=q["bits"],
                           group_size=q["group"], src=q["src"])
    for v, kind in [(FP8, "fp8"), (INT4, "int4")]:
        write_published(v, outdir, tokdir, tok_size, ids)
        info[v["name"]] = dict(kind=kind, arch=v["arch"], dtype="float32")
    return info


if __name__ == "__main__":
    script_main(build)

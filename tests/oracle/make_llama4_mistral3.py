#!/usr/bin/env python3
"""Builds tiny random Ministral 3 / Mistral 3 / Llama 4 test models for the mlx-gen oracle tests
(crates/cli/tests/llama4_mistral3.rs).

Usage: make_llama4_mistral3.py OUTDIR

Float variants are written Hugging Face style (float32):
  * ministral3-f32: sliding-window layers (window 12) beside full ones, YaRN rope from
    `rope_parameters`, the llama-4 attention scale with original_max_position_embeddings 16 (so the
    scale changes within the prompt), untied `lm_head`, unused `rotary_emb.inv_freq` tensors;
  * mistral3-f32: a `mistral3` folder whose text_config is such a ministral3 model, named as
    transformers 5 saves it (`model.language_model.*`, top-level `lm_head`), with vision-tower and
    projector tensors that mlx-lm drops;
  * llama4_text-f32: a dense Llama-4 text model, RoPE off on the last layer, q/k norms, head `output`;
  * llama4-f32: Llama 4 under `language_model.`: 4 layers (3 chunked-attention RoPE layers with
    chunk size 8, 1 global no-RoPE layer), MoE (4 experts + shared expert) on every second layer
    with Hugging Face's fused `experts.gate_up_proj` / `experts.down_proj`, q/k norms, llama3 rope
    scaling, temperature tuning with floor_scale 8, a vision tensor that mlx-lm drops.
Each gets a 4-bit (group 32) float32 copy made by mlx-lm's own `mlx_lm.convert` (NAME-q4);
mistral3 and llama4 also a mixed one (NAME-mixed: layer 1's feed-forward part, experts included, at
8 bits, the head left float: per-layer entries in `quantization` named under `language_model.`);
ministral3 and llama4 a bfloat16 4-bit one (NAME-q4-bf16: the query scales' casts matter there).
Deterministic (fixed seeds). Writes OUTDIR/variants.json. Run with the oracle venv's python.
"""

import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_models import convert_quietly, padded_vocab, script_main, write_float_folder  # noqa: E402

H, HEADS, KV, HD, INTER = 64, 4, 2, 32, 96
FLOAT = ["ministral3-f32", "mistral3-f32", "llama4_text-f32", "llama4-f32"]


def ministral3_config(vocab, ids):
    return {
        "model_type": "ministral3", "hidden_size": H, "num_hidden_layers": 4, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "rms_norm_eps": 1e-5,
        "vocab_size": vocab, "max_position_embeddings": 512, "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "sliding_window": 12,
        "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
        },
        "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
    }


def configs(name, vocab, ids):
    if name == "ministral3-f32":
        return dict(ministral3_config(vocab, ids), architectures=["Ministral3ForCausalLM"], torch_dtype="float32")
    if name == "mistral3-f32":
        text = ministral3_config(vocab, ids)
        del text["tie_word_embeddings"]  # mistral3.py makes it False
        return {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": text,
                "vision_config": {"model_type": "pixtral", "hidden_size": 8}, "torch_dtype": "float32",
                "eos_token_id": ids["eos"]}
    if name == "llama4_text-f32":
        return {
            "model_type": "llama4_text", "hidden_size": H, "num_attention_heads": HEADS, "num_hidden_layers": 4,
            "vocab_size": vocab, "intermediate_size": 32, "intermediate_size_mlp": INTER, "num_key_value_heads": KV,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "head_dim": HD, "tie_word_embeddings": False,
            "no_rope_layers": [1, 1, 1, 0], "use_qk_norm": True, "torch_dtype": "float32",
            "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
        }
    text = {
        "model_type": "llama4_text", "attention_bias": False, "attention_chunk_size": 8, "head_dim": HD,
        "hidden_size": H, "interleave_moe_layer_step": 2, "intermediate_size": 32, "intermediate_size_mlp": INTER,
        "max_position_embeddings": 512, "num_attention_heads": HEADS, "num_experts_per_tok": 1,
        "num_hidden_layers": 4, "num_key_value_heads": KV, "num_local_experts": 4, "rms_norm_eps": 1e-5,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
        "rope_theta": 500000.0, "use_qk_norm": True, "vocab_size": vocab, "attn_temperature_tuning": True,
        "floor_scale": 8, "attn_scale": 0.1,
    }
    return {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": text,
            "vision_config": {"hidden_size": 8}, "torch_dtype": "float32", "eos_token_id": ids["eos"]}


def weights(name, vocab, real_vocab):
    rng = np.random.RandomState(zlib.crc32(name.encode()) & 0x7FFFFFFF)

    def lin(o, i, gain=1.5):
        return (rng.standard_normal((o, i)) * gain / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def table():
        t = (rng.standard_normal((vocab, H)) * 0.5).astype(np.float32)
        t[real_vocab:] = 0.0
        return t

    w = {}
    llama4 = name == "llama4-f32"
    root = {"mistral3-f32": "model.language_model.", "llama4-f32": "language_model.model."}.get(name, "model.")
    ffn = "feed_forward." if name.startswith("llama4") else "mlp."
    w[root + "embed_tokens.weight"] = table()
    for l in range(4):
        p = f"{root}layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        for proj, o in [("q_proj", HEADS * HD), ("k_proj", KV * HD), ("v_proj", KV * HD)]:
            w[p + f"self_attn.{proj}.weight"] = lin(o, H, 2.0)
        w[p + "self_attn.o_proj.weight"] = lin(H, HEADS * HD)
        if name == "ministral3-f32":
            w[p + "self_attn.rotary_emb.inv_freq"] = (1.0 / 10000.0 ** (np.arange(0, HD, 2) / HD)).astype(np.float32)
        if llama4 and l % 2 == 1:
            e, i = 4, 32
            w[p + ffn + "router.weight"] = lin(e, H, 3.0)
            gate, up = rng.standard_normal((e, H, i)), rng.standard_normal((e, H, i))
            w[p + ffn + "experts.gate_up_proj"] = (np.concatenate([gate, up], -1) * 1.5 / np.sqrt(H)).astype(np.float32)
            w[p + ffn + "experts.down_proj"] = (rng.standard_normal((e, i, H)) * 1.5 / np.sqrt(i)).astype(np.float32)
            for proj, o, n_in in [("gate_proj", i, H), ("up_proj", i, H), ("down_proj", H, i)]:
                w[p + ffn + f"shared_expert.{proj}.weight"] = lin(o, n_in)
        else:
            for proj, o, n_in in [("gate_proj", INTER, H), ("up_proj", INTER, H), ("down_proj", H, INTER)]:
                w[p + ffn + f"{proj}.weight"] = lin(o, n_in)
    w[root + "norm.weight"] = norm(H)
    head = {"mistral3-f32": "lm_head.weight", "llama4-f32": "language_model.lm_head.weight",
            "llama4_text-f32": "output.weight"}.get(name, "lm_head.weight")
    w[head] = table()
    if name == "mistral3-f32":
        w["model.vision_tower.patch_conv.weight"] = rng.standard_normal((8, 3, 2, 2)).astype(np.float32)
        w["model.multi_modal_projector.linear_1.weight"] = lin(H, 8)
    if llama4:
        w["vision_model.patch_embedding.linear.weight"] = lin(8, 12)
    return w


def mixed_predicate(path, module):
    if ".layers.1." in path and (".mlp." in path or ".feed_forward." in path):
        return {"group_size": 32, "bits": 8, "mode": "affine"}
    return not path.endswith("lm_head")


def build(outdir, tokenizers, args):
    tokdir, tok_size, ids = tokenizers()
    vocab = padded_vocab(tok_size)
    info = {}
    for name in FLOAT:
        d = write_float_folder(outdir / name, configs(name, vocab, ids), weights(name, vocab, tok_size), tokdir)
        info[name] = dict(kind="float", dtype="float32")
        q = name.replace("-f32", "-q4")
        convert_quietly(d, outdir / q, quantize=True, q_bits=4, q_group_size=32, dtype="float32")
        info[q] = dict(kind="quantized", dtype="float32", bits=4, group_size=32, src=name)
        if name in ("ministral3-f32", "llama4-f32"):
            b = name.replace("-f32", "-q4-bf16")
            convert_quietly(d, outdir / b, quantize=True, q_bits=4, q_group_size=32, dtype="bfloat16")
            info[b] = dict(kind="quantized", dtype="bfloat16", bits=4, group_size=32, src=name)
        if name in ("mistral3-f32", "llama4-f32"):
            m = name.replace("-f32", "-mixed")
            convert_quietly(d, outdir / m, quantize=True, q_bits=4, q_group_size=32, dtype="float32",
                            quant_predicate=mixed_predicate)
            info[m] = dict(kind="quantized", dtype="float32", bits=4, group_size=32, src=name)
    return info


if __name__ == "__main__":
    script_main(build)

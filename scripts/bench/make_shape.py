#!/usr/bin/env python3
"""Writes a random-weight MLX model folder of a real model's shape, for benchmarks.

Usage: make_shape.py SHAPE OUTDIR [--bits 4] [--group-size 64] [--dtype bfloat16]
SHAPE: smollm2-135m | qwen3-0.6b | llama-3.2-3b | qwen2.5-7b | deepseek-v2-lite | qwen3-30b-a3b |
mixtral-8x7b | qwen3.5-2b | qwen3.5-9b | qwen3.5-35b-a3b. The weights are mlx-lm's own random
initialisation (seed 0), quantized with mlx-lm's quantize_model, saved with its save functions; the
tokenizer is the tiny test tokenizer (benchmarks feed random token ids). Both mlx-gen and mlx-lm load
the same folder.
"""
import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import quantize_model, save_config, save_model

SHAPES = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, intermediate_size=1536,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, rms_norm_eps=1e-5,
                         rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=8192),
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                       max_position_embeddings=40960),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, num_hidden_layers=28, intermediate_size=8192,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                         max_position_embeddings=131072,
                         rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192, rope_type="llama3")),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=False, max_position_embeddings=32768),
    # 16B total, 2.4B active per token (issue 8's benchmark shape)
    "deepseek-v2-lite": dict(model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                             moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                             num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64,
                             num_experts_per_tok=6, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                             v_head_dim=128, qk_nope_head_dim=128, first_k_dense_replace=1, moe_layer_freq=1,
                             topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
                             rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=163840,
                             tie_word_embeddings=False,
                             rope_scaling=dict(type="yarn", factor=40.0, beta_fast=32, beta_slow=1, mscale=0.707,
                                               mscale_all_dim=0.707, original_max_position_embeddings=4096)),
    # 30.5B total, 3.3B active (Qwen3-30B-A3B / Qwen3-Coder-30B-A3B)
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                          num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
                          moe_intermediate_size=768, rms_norm_eps=1e-6, vocab_size=151936, rope_theta=1000000.0,
                          tie_word_embeddings=False, max_position_embeddings=40960, norm_topk_prob=True),
    # Qwen3.5-9B-shaped: gated DeltaNet layers, full attention every 4th
    "qwen3.5-9b": dict(model_type="qwen3_5", hidden_size=4096, num_hidden_layers=32, intermediate_size=12288,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                       linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_conv_kernel_dim=4, full_attention_interval=4, vocab_size=248320, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, max_position_embeddings=262144,
                       rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                                            mrope_section=[11, 11, 10])),
    # A small Qwen3.5 (about 2B; an approximate shape, with the 9B's 16 key / 32 value linear heads): quick
    # to make on the device for the recurrence kernel's checks
    "qwen3.5-2b": dict(model_type="qwen3_5", hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                       linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_conv_kernel_dim=4, full_attention_interval=4, vocab_size=248320, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, max_position_embeddings=262144,
                       rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                                            mrope_section=[11, 11, 10])),
    # Qwen3.5-35B-A3B-shaped: 256 experts, top-8, a shared expert, on every layer
    "qwen3.5-35b-a3b": dict(model_type="qwen3_5_moe", hidden_size=2048, num_hidden_layers=40, intermediate_size=512,
                            num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                            linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                            linear_conv_kernel_dim=4, full_attention_interval=4, vocab_size=248320,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, norm_topk_prob=True, rms_norm_eps=1e-6,
                            tie_word_embeddings=False, max_position_embeddings=262144,
                            rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                                 partial_rotary_factor=0.25, mrope_section=[11, 11, 10])),
    # 46.7B total, 12.9B active
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                         num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1000000.0, tie_word_embeddings=False,
                         max_position_embeddings=32768),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("outdir")
    ap.add_argument("--bits", type=int, default=4, help="0 keeps floats")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--uniform", action="store_true",
                    help="every layer at --bits, ignoring the model's own quant_predicate (qwen3_moe's 8-bit routers)")
    ap.add_argument("--layers", type=int, help="fewer layers than the shape has (per-layer analyses on the CPU: graph_ops.py)")
    args = ap.parse_args()

    from mlx_lm.utils import _get_classes  # the architecture classes mlx-lm uses for this model_type

    config = dict(SHAPES[args.shape])
    if args.layers:
        config["num_hidden_layers"] = args.layers
    mx.random.seed(0)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    dtype = getattr(mx, args.dtype)
    model.set_dtype(dtype)
    if not args.bits:
        mx.eval(model.parameters())
    # Quantized, the float weights stay lazy: each is made and quantized as save_model evaluates its shard, so
    # the device holds the 4-bit model (about 20 GB for the 35B shape) rather than 2 bytes a parameter first.
    if args.bits:
        predicate = (lambda path, module: True) if args.uniform else None
        model, config = quantize_model(model, config, args.group_size, args.bits, quant_predicate=predicate)
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model, donate_model=True)
    config["torch_dtype"] = args.dtype
    save_config(config, config_path=out / "config.json")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "oracle"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "oracle"))
    from make_tokenizer import make_tokenizer

    make_tokenizer(out)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(json.dumps({"shape": args.shape, "dir": str(out), "weight_bytes": size}))


if __name__ == "__main__":
    main()

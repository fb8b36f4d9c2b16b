#!/usr/bin/env python3
"""Builds the matrix of tiny random test models for the mlx-gen oracle tests.

Usage: make_models.py OUTDIR [--only NAME]...

Each variant becomes OUTDIR/NAME, a real on-disk model folder:
  * float variants are written Hugging Face style (HF tensor names, `lm_head.weight` when untied,
    `torch_dtype`, tokenizer files; one has the unused `rotary_emb.inv_freq` tensors, one is
    sharded into two files plus `model.safetensors.index.json`, one has a `generation_config.json`
    with an extra eos id);
  * quantized variants are produced by mlx-lm's own `mlx_lm.convert` from a float variant, so their
    on-disk format is exactly mlx-lm's.
Everything is deterministic (fixed seeds).  Prints one line per variant produced and writes
OUTDIR/variants.json describing them.  Run with the oracle venv's python (scripts/oracle-venv.sh).

Also the shared frame of the other make_*.py scripts (see "Shared by the make_*.py scripts" below):
their command line and set-up (`script_main`), their tokenizer (`Tokenizers`) and the writers of
a model folder (`write_float_folder`, `start_folder`, `convert_quietly`, ...).
"""

import argparse
import contextlib
import io
import json
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The prompt the oracle tests use most; the generation_config variant's extra eos id is picked so
# that greedy decoding of this prompt (with the chat template) actually stops on it.
CANONICAL_PROMPT = "Hello, how are you?"

# ----------------------------------------------------------------------------------------------
# Tokenizer


def _fallback_make_tokenizer(outdir, kind="bpe"):
    """Stand-in for tests/oracle/make_tokenizer.py: a tiny deterministic byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    corpus = (
        "Hello, how are you? I am fine, thank you. The quick brown fox jumps over the lazy dog. "
        "Once upon a time there was a little model that wanted to talk. It said hello to the "
        "world and the world said hello back. What is the capital of France? Paris is the "
        "capital of France. 1 2 3 4 5 6 7 8 9 10. Write a story about a cat and a dog. "
        "café naïve résumé — “quotes” 日本語 emoji 🙂\n\tnew lines and tabs\n"
    ) * 3
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    byte_enc = pre_tokenizers.ByteLevel.alphabet()
    alphabet = sorted(byte_enc)
    words = [w for w, _ in pre.pre_tokenize_str(corpus)]
    seqs = [list(w) for w in words]
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    while len(vocab) < 256 + 60:
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], [-ord(c) for c in kv[0][0] + kv[0][1]]))[0]
        merges.append(best)
        new = best[0] + best[1]
        vocab[new] = len(vocab)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == best[0] and s[i + 1] == best[1]:
                    s[i : i + 2] = [new]
                i += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(str(outdir / "tokenizer.json"))
    template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    (outdir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def make_tokenizer(outdir, kind="bpe"):
    try:
        from make_tokenizer import make_tokenizer as theirs  # tests/oracle/make_tokenizer.py
    except ImportError:
        theirs = None
    if theirs is not None:
        theirs(str(outdir), kind=kind)
    elif kind == "bpe":
        _fallback_make_tokenizer(outdir)
    else:
        raise RuntimeError(f"tokenizer kind {kind!r} needs tests/oracle/make_tokenizer.py")


def tokenizer_info(tokdir):
    """(vocab size with added tokens, {"eos": id, "bos": id or None, "other": [special ids]})."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
    size = tok.get_vocab_size(with_added_tokens=True)
    cfg = json.loads((Path(tokdir) / "tokenizer_config.json").read_text())

    def tid(t):
        if isinstance(t, dict):
            t = t.get("content")
        return tok.token_to_id(t) if t else None

    eos, bos = tid(cfg.get("eos_token")), tid(cfg.get("bos_token"))
    specials = sorted(tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<s>", "</s>", "<unk>")
                      if tok.token_to_id(t) is not None)
    other = [i for i in specials if i != eos]
    return size, {"eos": eos, "bos": bos if bos is not None else other[0], "other": other, "specials": specials}


# ----------------------------------------------------------------------------------------------
# Shared by the make_*.py scripts (make_models.py, make_deepseek.py, make_deepseek_sparse.py,
# make_moe.py, make_qwen35.py, make_llama4_mistral3.py).  The Rust tests hash make_models.py into
# the cache key of every script's models, so these helpers live here rather than in a module of
# their own.


def padded_vocab(tok_size):
    """The test models' vocabulary size: the tokenizer's, rounded up to a multiple of 64 (the rows past
    the tokenizer's are the padding the embedding and head zero)."""
    return (tok_size + 63) // 64 * 64


def write_json(path, obj):
    """obj as indented JSON plus a newline, as every config.json and index here is written."""
    Path(path).write_text(json.dumps(obj, indent=2) + "\n")


def fresh_dir(d, create=True):
    """Removes the folder d if it exists (a variant from an earlier run), then creates it empty unless
    `create` is false (for writers that create it themselves, as mlx_lm.convert does). Returns d."""
    if d.exists():
        shutil.rmtree(d)
    if create:
        d.mkdir(parents=True)
    return d


def copy_tokenizer(tokdir, d):
    """Copies every file of the tokenizer folder tokdir into the model folder d."""
    for f in tokdir.iterdir():
        shutil.copy(f, d / f.name)


def start_folder(d, cfg, tokdir):
    """A fresh model folder d holding cfg as config.json and the tokenizer files; the caller writes
    the weights. Returns d."""
    fresh_dir(d)
    write_json(d / "config.json", cfg)
    copy_tokenizer(tokdir, d)
    return d


def write_float_folder(d, cfg, weights, tokdir, fmt="pt"):
    """A fresh model folder d: cfg as config.json, the tokenizer files, and `weights` ({name: numpy or
    MLX array}, each saved in its own dtype) as one model.safetensors whose metadata format is `fmt`
    ("pt": Hugging Face names, which mlx-lm's sanitize converts; "mlx": mlx-lm's own). Returns d."""
    import mlx.core as mx

    start_folder(d, cfg, tokdir)
    arrays = {k: mx.array(x) for k, x in weights.items()}
    mx.save_safetensors(str(d / "model.safetensors"), arrays, metadata={"format": fmt})
    return d


def write_float_variants(outdir, tokenizer, variants, config_and_weights):
    """Writes each of `variants` (dicts with a "name" and an "arch") as a float32 folder OUTDIR/NAME
    (write_float_folder) whose config and weights are config_and_weights(v, vocab size, the
    tokenizer's own vocabulary size, special ids); `tokenizer` is what Tokenizers gives. Returns
    their variants.json entries."""
    tokdir, tok_size, ids = tokenizer
    info = {}
    for v in variants:
        cfg, weights = config_and_weights(v, padded_vocab(tok_size), tok_size, ids)
        write_float_folder(outdir / v["name"], cfg, weights, tokdir)
        info[v["name"]] = dict(kind="float", arch=v["arch"], dtype="float32")
    return info


def convert_quietly(src, dst, **kwargs):
    """mlx-lm's own `mlx_lm.convert(src, dst, **kwargs)` into a fresh dst (removed first: convert will
    not write into an existing folder), its progress output swallowed. convert writes a README.md
    model card too; harmless, it is kept (it is what users get)."""
    from mlx_lm import convert

    fresh_dir(Path(dst), create=False)
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), str(dst), **kwargs)
    return Path(dst)


class Tokenizers:
    """The tokenizers of one script run, each made on first use in OUTDIR/_tokenizer-KIND (a stale one
    from an interrupted run is replaced) and removed by `remove` once the variants have copied it."""

    def __init__(self, outdir):
        self.outdir = outdir
        self.made = {}

    def __call__(self, kind="bpe"):
        """(tokenizer folder, vocabulary size with added tokens, special ids: see tokenizer_info)."""
        if kind not in self.made:
            tokdir = fresh_dir(self.outdir / f"_tokenizer-{kind}", create=False)
            make_tokenizer(tokdir, kind)
            self.made[kind] = (tokdir,) + tokenizer_info(tokdir)
        return self.made[kind]

    def remove(self):
        for tokdir, _, _ in self.made.values():
            shutil.rmtree(tokdir)


def script_main(build, add_arguments=None):
    """The command line and frame of every make_*.py: `SCRIPT OUTDIR` (plus what add_arguments(parser)
    adds). Runs MLX on the CPU, creates OUTDIR, calls build(outdir, tokenizers, args), which writes the
    variants into OUTDIR (`tokenizers(kind)` gives a tokenizer: see Tokenizers) and returns
    {variant name: description}; then removes the tokenizer folders, prints the variant names one a
    line (sorted) and writes the descriptions to OUTDIR/variants.json."""
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args()

    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    outdir = Path(args.outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    tokenizers = Tokenizers(outdir)
    info = build(outdir, tokenizers, args)
    tokenizers.remove()
    for name in sorted(info):
        print(name)
    (outdir / "variants.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------
# The matrix

# Float (Hugging Face style) variants.
FLOAT = [
    # Llama 3: llama3 rope scaling, GQA, untied lm_head, rotary_emb.inv_freq tensors, two shards.
    dict(name="llama3-f32", arch="llama", dtype="float32", hidden=64, inter=192, heads=4, kv=2,
         tied=False, rope="llama3", inv_freq=True, shards=2, config_eos="list"),
    # Llama with linear rope scaling, MHA, tied, bf16, generation_config.json with an extra eos.
    dict(name="llama-linear-bf16", arch="llama", dtype="bfloat16", hidden=64, inter=128, heads=4,
         kv=4, tied=True, rope="linear", gen_config_eos=True),
    # Llama with an explicit head_dim (32) != hidden/heads (16), GQA, tied.
    dict(name="llama-headdim-f32", arch="llama", dtype="float32", hidden=64, inter=128, heads=4,
         kv=2, tied=True, head_dim=32),
    # Hidden 128 so that group size 128 can quantize everything.
    dict(name="llama-h128-f32", arch="llama", dtype="float32", hidden=128, inter=256, heads=4,
         kv=2, tied=False, rope="llama3"),
    # Mistral, with the SentencePiece-style (Llama 2 / Mistral) tokenizer.
    dict(name="mistral-f32", arch="mistral", dtype="float32", hidden=64, inter=192, heads=4, kv=1,
         tied=False, tokenizer="spm"),
    dict(name="qwen2-f32", arch="qwen2", dtype="float32", hidden=64, inter=128, heads=4, kv=2,
         tied=True),
    dict(name="qwen2-bf16", arch="qwen2", dtype="bfloat16", hidden=64, inter=192, heads=4, kv=4,
         tied=False),
    dict(name="qwen3-f32", arch="qwen3", dtype="float32", hidden=64, inter=192, heads=4, kv=2,
         tied=True, head_dim=32),
    dict(name="qwen3-bf16", arch="qwen3", dtype="bfloat16", hidden=64, inter=128, heads=4, kv=4,
         tied=False, head_dim=16),
]

# Quantized variants, made with mlx_lm.convert from a float variant (`src`).
# `dtype` is convert's dtype (of the non-quantized parameters and the scales/biases).
QUANT = [
    dict(name="llama3-q4g64", src="llama3-f32", bits=4, group=64, dtype="bfloat16"),
    dict(name="qwen2-q4g32", src="qwen2-f32", bits=4, group=32, dtype="bfloat16"),
    dict(name="qwen3-q8g64", src="qwen3-f32", bits=8, group=64, dtype="bfloat16"),
    dict(name="mistral-q2g64", src="mistral-f32", bits=2, group=64, dtype="float32"),
    dict(name="llama-headdim-q3g32", src="llama-headdim-f32", bits=3, group=32, dtype="bfloat16"),
    dict(name="qwen3-q5g32", src="qwen3-bf16", bits=5, group=32, dtype="bfloat16"),
    dict(name="qwen2-q6g64", src="qwen2-bf16", bits=6, group=64, dtype="float32"),
    dict(name="llama-h128-q4g128", src="llama-h128-f32", bits=4, group=128, dtype="bfloat16"),
    dict(name="llama-linear-q8g32", src="llama-linear-bf16", bits=8, group=32, dtype="bfloat16"),
    # mlx-lm's recipe: 3 bits, 6 bits for v_proj/down_proj of some layers and lm_head.
    dict(name="llama3-mixed-3-6", src="llama3-f32", bits=None, group=64, dtype="bfloat16",
         predicate="mixed_3_6"),
    # Custom predicate: 4-bit g64 default, layer 0's MLP 8-bit g32, lm_head left in float.
    dict(name="qwen3-mixed-custom", src="qwen3-bf16", bits=4, group=64, dtype="bfloat16",
         predicate="custom_8bit_layer0_mlp"),
]


def custom_8bit_layer0_mlp(path, module):
    if path.startswith("model.layers.0.mlp."):
        return {"group_size": 32, "bits": 8, "mode": "affine"}
    if path == "lm_head":
        return False
    return True


ARCH = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], rope_theta=500000.0),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"], rope_theta=1000000.0),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], rope_theta=1000000.0),
}


def make_config(v, vocab_size, ids):
    a = ARCH[v["arch"]]
    heads = v["heads"]
    head_dim = v.get("head_dim") or v["hidden"] // heads
    cfg = {
        "architectures": a["architectures"],
        "model_type": a["model_type"],
        "hidden_size": v["hidden"],
        "intermediate_size": v["inter"],
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": v["kv"],
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6 if v["arch"] != "llama" else 1e-5,
        "rope_theta": a["rope_theta"],
        "tie_word_embeddings": v["tied"],
        "vocab_size": vocab_size,
        "torch_dtype": v["dtype"],
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "initializer_range": 0.02,
        "use_cache": True,
        "transformers_version": "4.51.0",
    }
    if v["arch"] in ("llama", "mistral"):
        cfg["attention_bias"] = False
        cfg["mlp_bias"] = False
    if v["arch"] == "qwen3" or "head_dim" in v:
        cfg["head_dim"] = head_dim
    if v["arch"] == "mistral":
        cfg["sliding_window"] = None
    if v["arch"] in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = 2
    rope = v.get("rope")
    if rope == "llama3":
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    elif rope == "linear":
        cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
        cfg["rope_theta"] = 10000.0
    if v.get("config_eos") == "list":
        cfg["eos_token_id"] = [ids["eos"], ids["other"][0]]
    return cfg, head_dim


def make_weights(v, cfg, head_dim, real_vocab):
    """Random weights, numpy float32, HF names. Scaled so that the logits are far from flat."""
    rng = np.random.RandomState(zlib.crc32(v["name"].encode()) & 0x7FFFFFFF)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def lin(out_dim, in_dim, gain=1.0):
        return (rng.standard_normal((out_dim, in_dim)) * gain / np.sqrt(in_dim)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {}
    emb = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    emb[real_vocab:] = 0.0  # padded vocab rows: logit 0, never the argmax
    w["model.embed_tokens.weight"] = emb
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = lin(nh * head_dim, H, 2.0)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * head_dim, H, 2.0)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * head_dim, H, 1.5)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * head_dim, 1.5)
        if cfg["model_type"] == "qwen2":
            w[p + "self_attn.q_proj.bias"] = (0.3 * rng.standard_normal(nh * head_dim)).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (0.3 * rng.standard_normal(nkv * head_dim)).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (0.3 * rng.standard_normal(nkv * head_dim)).astype(np.float32)
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        w[p + "mlp.gate_proj.weight"] = lin(I, H, 1.5)
        w[p + "mlp.up_proj.weight"] = lin(I, H, 1.5)
        w[p + "mlp.down_proj.weight"] = lin(H, I, 1.5)
        if v.get("inv_freq"):
            inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
            w[p + "self_attn.rotary_emb.inv_freq"] = inv.astype(np.float32)
    w["model.norm.weight"] = norm(H)
    if not cfg["tie_word_embeddings"]:
        head = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
        head[real_vocab:] = 0.0
        w["lm_head.weight"] = head
    return w


def write_float_variant(v, outdir, tokdir, tok_size, ids):
    import mlx.core as mx

    d = outdir / v["name"]
    cfg, head_dim = make_config(v, padded_vocab(tok_size), ids)
    weights = make_weights(v, cfg, head_dim, tok_size)
    dt = getattr(mx, v["dtype"])
    arrays = {k: mx.array(x).astype(dt if "inv_freq" not in k else mx.float32) for k, x in weights.items()}
    start_folder(d, cfg, tokdir)
    names = sorted(arrays)
    nshards = v.get("shards", 1)
    if nshards == 1:
        mx.save_safetensors(str(d / "model.safetensors"), arrays, metadata={"format": "pt"})
    else:
        # HF style: split by name order, index.json maps each tensor to its file.
        per = (len(names) + nshards - 1) // nshards
        weight_map = {}
        total = 0
        for s in range(nshards):
            fname = f"model-{s + 1:05d}-of-{nshards:05d}.safetensors"
            part = {k: arrays[k] for k in names[s * per : (s + 1) * per]}
            mx.save_safetensors(str(d / fname), part, metadata={"format": "pt"})
            for k, a in part.items():
                weight_map[k] = fname
                total += a.nbytes
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write_json(d / "model.safetensors.index.json", index)
    return d


def greedy_tokens(model_dir, prompt, max_tokens=64):
    """Greedy tokens (chat template), as reference.py computes them."""
    import reference

    return reference.run(str(model_dir), prompt, max_tokens)["tokens"]


def add_generation_config_eos(d, ids):
    """generation_config.json whose eos list adds a token greedy decoding produces mid-way."""
    toks = greedy_tokens(d, CANONICAL_PROMPT)
    extra = None
    for i in range(6, len(toks)):
        if toks[i] not in toks[:i] and toks[i] not in ids["specials"]:
            extra = toks[i]
            break
    if extra is None:
        raise RuntimeError(f"{d.name}: no suitable extra eos token in {toks}")
    gen = {
        "bos_token_id": ids["bos"],
        "eos_token_id": [ids["eos"], extra],
        "do_sample": False,
        "transformers_version": "4.51.0",
    }
    write_json(d / "generation_config.json", gen)
    return extra


def write_quant_variant(q, outdir):
    pred = q.get("predicate")
    if pred == "custom_8bit_layer0_mlp":
        pred = custom_8bit_layer0_mlp
    return convert_quietly(outdir / q["src"], outdir / q["name"], quantize=True, q_bits=q["bits"],
                           q_group_size=q["group"], dtype=q["dtype"], quant_predicate=pred)


def build(outdir, tokenizers, args):
    floats = {v["name"]: v for v in FLOAT}
    quants = {q["name"]: q for q in QUANT}
    wanted = set(args.only) if args.only else set(floats) | set(quants)
    unknown = wanted - set(floats) - set(quants)
    if unknown:
        sys.exit(f"unknown variant(s): {sorted(unknown)}; known: {sorted(floats) + sorted(quants)}")
    # quantized variants need their float source
    needed = set(wanted) | {quants[n]["src"] for n in wanted if n in quants}

    info = {}
    for v in FLOAT:
        if v["name"] not in needed:
            continue
        tokdir, tok_size, ids = tokenizers(v.get("tokenizer", "bpe"))
        d = write_float_variant(v, outdir, tokdir, tok_size, ids)
        entry = dict(kind="float", arch=v["arch"], dtype=v["dtype"], tied=v["tied"],
                     kv_heads=v["kv"], heads=v["heads"], tokenizer=v.get("tokenizer", "bpe"))
        if v.get("gen_config_eos"):
            entry["extra_eos"] = add_generation_config_eos(d, ids)
        info[v["name"]] = entry
    for q in QUANT:
        if q["name"] not in needed:
            continue
        write_quant_variant(q, outdir)
        src = floats[q["src"]]
        info[q["name"]] = dict(kind="quantized", arch=src["arch"], dtype=q["dtype"], bits=q["bits"],
                               group_size=q["group"], predicate=q.get("predicate"), src=q["src"],
                               tokenizer=src.get("tokenizer", "bpe"))
    return info


def main():
    script_main(build, lambda ap: ap.add_argument("--only", action="append", default=[],
                                                  help="build only this variant (repeatable)"))


if __name__ == "__main__":
    main()

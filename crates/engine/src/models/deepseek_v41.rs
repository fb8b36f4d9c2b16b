//! `deepseek_v41` (DeepSeek-V4.1 text model) as mlx-lm's `models/deepseek_v41.py`: `hc_mult`
//! hyper-connection streams mixed around each attention and MoE block (Sinkhorn-normalised
//! mixing), attention over a sliding window of single-head latents plus, on compressing layers,
//! the top-k of the compressed groups the indexer picks (with per-head sinks and the FP8 / FP4
//! rounding the reference applies), a grouped low-rank output, and clamped-SwiGLU experts with
//! `sqrtsoftplus` routing. Each layer keeps its own [`LayerCache`] (window, compressed groups,
//! index keys, the open group's rows), which cannot be trimmed, as mlx-lm's.
use super::Model;
use crate::cache::KvCache;
use crate::error::{EngineError, Result};
use crate::pipeline::Stage;
use crate::nn::{Embedding, Linear, QuantConfig, RmsNorm, RopeScaling};
use checkpoint::Weights;
use mlx::distributed::Group;
use mlx::{ops, Array, Dtype};
use serde::Deserialize;

/// `ModelArgs` of deepseek_v41.py (defaults in [`defaults`]).
#[derive(Clone, Debug, Deserialize)]
struct Config {
    vocab_size: i32,
    hidden_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    head_dim: i32,
    q_lora_rank: i32,
    qk_rope_head_dim: i32,
    o_groups: i32,
    o_lora_rank: i32,
    moe_intermediate_size: i32,
    n_routed_experts: i32,
    num_experts_per_tok: i32,
    scoring_func: String,
    gate_temp: f64,
    norm_topk_prob: bool,
    routed_scaling_factor: f64,
    swiglu_limit: f64,
    rms_norm_eps: f64,
    sliding_window: i32,
    compress_ratios: Vec<i32>,
    kv_source_layer_ids: Vec<i32>,
    index_source_layer_ids: Vec<i32>,
    compress_rope_theta: f64,
    candidate_source_layer_id: i32,
    candidate_topk_blocks: i32,
    candidate_block_size: i32,
    index_n_heads: i32,
    index_head_dim: i32,
    index_topk: i32,
    rope_theta: f64,
    rope_scaling: Option<RopeScaling>,
    max_position_embeddings: f64,
    hc_mult: i32,
    hc_sinkhorn_iters: i32,
    hc_eps: f64,
    engram_layer_ids: Vec<i32>,
}

fn defaults() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 64,
        "head_dim": 512, "q_lora_rank": 1280, "qk_rope_head_dim": 64, "o_groups": 8, "o_lora_rank": 1024,
        "moe_intermediate_size": 2304, "n_routed_experts": 384, "num_experts_per_tok": 6,
        "scoring_func": "sqrtsoftplus", "gate_temp": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "rms_norm_eps": 1e-20, "sliding_window": 128, "compress_ratios": [],
        "kv_source_layer_ids": [], "index_source_layer_ids": [], "compress_rope_theta": 160000.0,
        "candidate_source_layer_id": -1, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
        "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "rope_theta": 10000.0,
        "rope_scaling": null, "max_position_embeddings": 1048576, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "engram_layer_ids": [],
    })
}

/// `ModelArgs.from_dict`: a `text_config` (with the top-level model_type) over the defaults.
fn parse(config: &serde_json::Value) -> Result<Config> {
    let params = config.get("text_config").unwrap_or(config);
    let mut merged = defaults();
    if let (Some(m), Some(p)) = (merged.as_object_mut(), params.as_object()) {
        m.extend(p.clone());
    }
    let c: Config = serde_json::from_value(merged).map_err(|e| EngineError::Config(e.to_string()))?;
    let positive = [
        ("hc_mult", c.hc_mult),
        ("o_groups", c.o_groups),
        ("sliding_window", c.sliding_window),
        ("candidate_block_size", c.candidate_block_size),
        ("num_experts_per_tok", c.num_experts_per_tok),
        ("index_topk", c.index_topk),
        ("hc_sinkhorn_iters", c.hc_sinkhorn_iters),
    ];
    if let Some((name, v)) = positive.iter().find(|(_, v)| *v <= 0) {
        return Err(EngineError::Config(format!("deepseek_v41 needs a positive {name}, not {v}")));
    }
    if (c.num_attention_heads * c.head_dim) % c.o_groups != 0 || c.num_experts_per_tok > c.n_routed_experts {
        return Err(EngineError::Config(format!(
            "deepseek_v41: o_groups {} must divide heads x head_dim ({}), and num_experts_per_tok {} be at most n_routed_experts {}",
            c.o_groups,
            c.num_attention_heads * c.head_dim,
            c.num_experts_per_tok,
            c.n_routed_experts
        )));
    }
    if !c.engram_layer_ids.is_empty() {
        return Err(EngineError::Config(format!(
            "layers {:?} use engram memory, which deepseek_v41 does not have (nor does mlx-lm)",
            c.engram_layer_ids
        )));
    }
    Ok(c)
}

mod attention;
mod cache;
mod mixing;
mod moe;
mod pipeline;
mod published;
mod rounding;
pub use published::{sanitize, sanitized_shapes};
use attention::{Attention, Shared};
pub use cache::LayerCache;
use mixing::{collapse, expand, HyperConnection};
use moe::Moe;

struct Layer {
    self_attn: Attention,
    mlp: Moe,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
}

pub struct DeepseekV41 {
    config: Config,
    model_type: String,
    vocab_size: i32,
    hc: i32,
    window: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// A pipeline stage, with the shared state it receives and sends (`_shared_in`, `_shared_out`).
    stage: Option<(Stage, pipeline::Crossing, pipeline::Crossing)>,
}

/// `_window_indices`: for each of `length` new queries, the window rows it attends to (the
/// window holds `previous` rows, then the new ones), -1 for none; (length, width) int32.
fn window_indices(previous: i32, length: i32, window: i32) -> Result<Array> {
    let width = window.min(previous + length);
    let end = ops::arange(0.0, f64::from(length), 1.0, Dtype::I32)?.add_scalar(f64::from(previous))?;
    let start = end.sub_scalar(f64::from(window - 1))?.maximum_scalar(0.0)?;
    let idx = start.expand_dims(&[1])?.add(&ops::arange(0.0, f64::from(width), 1.0, Dtype::I32)?.expand_dims(&[0])?)?;
    Ok(ops::where_(&idx.gt(&end.expand_dims(&[1])?)?, &Array::scalar(-1.0, Dtype::I32)?, &idx)?)
}

impl Model for DeepseekV41 {
    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed_tokens.arrays();
        for l in &self.layers {
            v.extend(l.self_attn.arrays());
            v.extend(l.mlp.arrays());
            v.extend(l.input_layernorm.arrays());
            v.extend(l.post_attention_layernorm.arrays());
            v.extend(l.attn_hc.arrays());
            v.extend(l.ffn_hc.arrays());
        }
        v.extend(self.norm.arrays());
        v.extend(self.lm_head.arrays());
        v
    }

    fn make_cache(&self) -> Vec<Box<dyn KvCache>> {
        self.layers.iter().map(|_| Box::new(LayerCache::new(self.window)) as Box<dyn KvCache>).collect()
    }

    /// mlx-lm's `pipeline`: this rank's layers (loaded alone), and what crosses its boundaries.
    fn pipeline(&mut self, stage: Stage) -> Result<()> {
        stage.check_loaded(self.layers.len())?;
        let r = stage.layers();
        let (shared_in, shared_out) = (pipeline::crossing(&self.config, r.start), pipeline::crossing(&self.config, r.end));
        self.stage = Some((stage, shared_in, shared_out));
        Ok(())
    }

    fn shard(&mut self, group: &Group) -> Result<()> {
        for l in &mut self.layers {
            l.self_attn = l.self_attn.shard(group)?;
            l.mlp = l.mlp.shard(group)?;
        }
        Ok(())
    }

    fn forward(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array> {
        super::check_caches(cache, self.layers.len())?;
        let mut caches = cache
            .iter_mut()
            .map(|c| c.as_any_mut().and_then(|a| a.downcast_mut::<LayerCache>()))
            .collect::<Option<Vec<&mut LayerCache>>>()
            .ok_or_else(|| EngineError::Invalid("deepseek_v41 runs on its own layer caches".into()))?;
        let h = self.embed_tokens.forward(tokens)?; // (B, L, D)
        let (b, l) = (h.dim(0), h.dim(1));
        let start = caches[0].offset;
        // Every layer's window holds the same rows, so all use the same indices.
        let previous = caches[0].window.as_ref().map_or(0, |w| w.dim(1));
        let window_idx = window_indices(previous, l, self.window)?.expand_dims(&[0])?.add(&ops::zeros(&[b, 1, 1], Dtype::I32)?)?; // (B, L, width)
        let h4 = h.expand_dims(&[2])?;
        let mut streams = h4.broadcast_to(&[b, l, self.hc, h.dim(2)])?; // (B, L, hc, D)
        let first = ops::full(&[b, l, 1], 1.0, Dtype::F32)?;
        let mut pre_mix = ops::concatenate(&[&first, &ops::zeros(&[b, l, self.hc - 1], Dtype::F32)?], -1)?; // (B, L, hc)
        let mut shared = Shared::default();
        if let Some((stage, shared_in, _)) = self.stage.as_ref().filter(|(s, ..)| s.receives()) {
            (streams, pre_mix) = pipeline::receive(&self.config, stage, shared_in, &streams, start, caches[0], &mut shared)?;
        }
        for (layer, c) in self.layers.iter().zip(caches.iter_mut()) {
            let (attn_pre, attn_post, attn_comb) = layer.attn_hc.forward(&streams)?;
            let x = layer.input_layernorm.forward(&collapse(&streams, &pre_mix)?)?;
            let x = layer.self_attn.forward(&x, start, &window_idx, c, &mut shared)?;
            streams = expand(&x, &streams, &attn_post, &attn_comb)?;
            let (ffn_pre, ffn_post, ffn_comb) = layer.ffn_hc.forward(&streams)?;
            let x = layer.mlp.forward(&layer.post_attention_layernorm.forward(&collapse(&streams, &attn_pre)?)?)?;
            streams = expand(&x, &streams, &ffn_post, &ffn_comb)?;
            pre_mix = ffn_pre;
        }
        if let Some((stage, _, shared_out)) = self.stage.as_ref().filter(|(s, ..)| s.sends()) {
            pipeline::send(&self.config, stage, shared_out, &streams, &pre_mix, start, &shared)?;
        }
        let mut out = collapse(&streams, &pre_mix)?;
        if let Some((stage, ..)) = &self.stage {
            // Rank 0 runs the last layers, and every rank needs its output.
            out = stage.gather(&out)?;
        }
        let out = self.norm.forward(&out)?;
        self.lm_head.forward(&out) // (B, L, vocab)
    }
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c = parse(config)?;
    let model_type = config.get("model_type").and_then(|t| t.as_str()).unwrap_or("deepseek_v41").to_owned();
    sanitize(config, weights)?;
    let vb = weights.view("model");
    let mut layers = Vec::new();
    for i in (0..c.num_hidden_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        layers.push(Layer {
            self_attn: Attention::load(&l.pp("self_attn"), &c, i, q)?,
            mlp: Moe::load(&l.pp("mlp"), &c, q)?,
            input_layernorm: RmsNorm::load(&l.pp("input_layernorm"), c.hidden_size, c.rms_norm_eps)?,
            post_attention_layernorm: RmsNorm::load(&l.pp("post_attention_layernorm"), c.hidden_size, c.rms_norm_eps)?,
            attn_hc: HyperConnection::load(&l.pp("attn_hc"), &c)?,
            ffn_hc: HyperConnection::load(&l.pp("ffn_hc"), &c)?,
        });
    }
    Ok(Box::new(DeepseekV41 {
        config: c.clone(),
        model_type,
        vocab_size: c.vocab_size,
        hc: c.hc_mult,
        window: c.sliding_window,
        embed_tokens: Embedding::load(&vb.pp("embed_tokens"), c.vocab_size, c.hidden_size, q)?,
        layers,
        norm: RmsNorm::load(&vb.pp("norm"), c.hidden_size, c.rms_norm_eps)?,
        lm_head: Linear::load(&weights.view("lm_head"), c.hidden_size, c.vocab_size, false, q)?,
        stage: None,
    }))
}

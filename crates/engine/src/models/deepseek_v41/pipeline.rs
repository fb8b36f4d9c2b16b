//! deepseek_v41.py's pipeline stages: what a stage hands the next besides the streams and the
//! `pre_mix` weights, the shared state that later layers read from earlier ones (`_crossing`),
//! packed as one byte message in `_layout`'s order, each part at a multiple of 8 bytes.
use super::cache::{append, LayerCache};
use super::{Config, Shared};
use crate::error::{EngineError, Result};
use crate::pipeline::Stage;
use mlx::{ops, Array, Dtype};

/// Shared state that crosses a stage boundary: (key, the layer that writes it).
pub(super) type Crossing = Vec<(&'static str, i32)>;

/// The shared state one layer reads, as (key, layer that writes it), in `_shared_reads`' order.
fn shared_reads(c: &Config, layer: i32) -> Vec<(&'static str, i32)> {
    let ratios = &c.compress_ratios;
    if ratios.get(layer as usize).copied().unwrap_or(0) == 0 {
        return Vec::new();
    }
    let (kv, index) = (&c.kv_source_layer_ids, &c.index_source_layer_ids);
    let last = |m: &dyn Fn(i32) -> bool| (0..=layer).rev().find(|&j| m(j));
    let mut reads = vec![("compress_kv", last(&|j| kv.contains(&j) && ratios[j as usize] != 0))];
    if index.contains(&layer) {
        reads.push(("index_k", last(&|j| kv.contains(&j) && index.contains(&j))));
        let source = c.candidate_source_layer_id;
        if (0..layer).contains(&source) && c.candidate_topk_blocks > 0 {
            reads.push(("candidates", Some(source)));
        }
    } else {
        reads.push(("topk_idx", last(&|j| index.contains(&j))));
    }
    reads.into_iter().filter_map(|(k, s)| s.map(|s| (k, s))).collect()
}

/// `_crossing`: the shared state that layers from `boundary` on read from layers before it.
pub(super) fn crossing(c: &Config, boundary: i32) -> Crossing {
    let mut out: Crossing = Vec::new();
    for layer in boundary..c.num_hidden_layers {
        for (key, source) in shared_reads(c, layer).into_iter().filter(|(_, s)| *s < boundary) {
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = source,
                None => out.push((key, source)),
            }
        }
    }
    out
}

/// `_entries`: the compressed entries of kv source `source` after `position` tokens.
fn entries(c: &Config, source: Option<i32>, position: i32) -> i32 {
    // A source that does not compress (ratio 0) has no entries.
    match source.and_then(|s| c.compress_ratios.get(s as usize)) {
        Some(&r) if r > 0 => position / r,
        _ => 0,
    }
}

/// `_index_keys`: the index keys that index layer `layer` scores after `position` tokens.
fn index_keys(c: &Config, layer: i32, position: i32) -> i32 {
    entries(c, shared_reads(c, layer).into_iter().find(|(k, _)| *k == "index_k").map(|(_, s)| s), position)
}

/// `_layout`: the message's parts as (key, shape, dtype).
fn layout(c: &Config, crossing: &[(&'static str, i32)], b: i32, l: i32, start: i32, dtype: Dtype) -> Vec<(&'static str, Vec<i32>, Dtype)> {
    let end = start + l;
    let mut parts = vec![("streams", vec![b, l, c.hc_mult, c.hidden_size], dtype), ("pre_mix", vec![b, l, c.hc_mult], Dtype::F32)];
    for &(key, source) in crossing {
        parts.push(match key {
            "compress_kv" | "index_k" => {
                let new = entries(c, Some(source), end) - entries(c, Some(source), start);
                let width = if key == "compress_kv" { c.head_dim } else { c.index_head_dim };
                (key, vec![b, new, width], dtype)
            }
            "candidates" => {
                let block = c.candidate_block_size;
                (key, vec![b, l, (index_keys(c, source, end) + block - 1) / block], Dtype::Bool)
            }
            _ => (key, vec![b, l, c.index_topk.min(index_keys(c, source, end))], Dtype::I32),
        });
    }
    parts
}

/// A part's bytes in a message, padded to a multiple of 8.
fn nbytes(shape: &[i32], dtype: Dtype) -> i32 {
    let size = shape.iter().product::<i32>() * dtype.size() as i32;
    (size + 7) / 8 * 8
}

/// The previous stage's message: the streams and pre_mix, with the shared state put in `shared`
/// (new compressed entries appended to the stage's first layer cache, which keeps them).
pub(super) fn receive(c: &Config, stage: &Stage, crossing: &[(&'static str, i32)], like: &Array, start: i32, cache: &mut LayerCache, shared: &mut Shared) -> Result<(Array, Array)> {
    let (b, l) = (like.dim(0), like.dim(1));
    let parts = layout(c, crossing, b, l, start, like.dtype());
    let size: i32 = parts.iter().map(|(_, s, d)| nbytes(s, *d)).sum();
    let packed = stage.recv_like(&ops::zeros(&[size], Dtype::U8)?)?;
    let mut offset = 0;
    let (mut streams, mut pre_mix) = (None, None);
    for (key, shape, dtype) in parts {
        let n = shape.iter().product::<i32>() * dtype.size() as i32;
        let mut flat_shape = shape.clone();
        *flat_shape.last_mut().expect("a shape") *= dtype.size() as i32;
        let part = packed.slice_axis(0, offset, offset + n)?.reshape(&flat_shape)?.view(dtype)?;
        offset += nbytes(&shape, dtype);
        match key {
            "streams" => streams = Some(part),
            "pre_mix" => pre_mix = Some(part),
            "compress_kv" | "index_k" => {
                let field = if key == "compress_kv" { &mut cache.compress_kv } else { &mut cache.index_k };
                if part.dim(1) > 0 {
                    *field = Some(append(field, &part)?);
                }
                if key == "compress_kv" {
                    shared.compress_kv = field.clone();
                } else {
                    shared.index_k = field.clone();
                }
            }
            "candidates" => {
                let source = crossing.iter().find(|(k, _)| *k == key).map_or(-1, |(_, s)| *s);
                let keys = index_keys(c, source, start + l);
                let mask = part.repeat(c.candidate_block_size, -1)?;
                shared.candidates = (keys > 0).then(|| mask.slice_axis(-1, 0, keys)).transpose()?;
            }
            _ => shared.topk_idx = Some(part),
        }
    }
    match (streams, pre_mix) {
        (Some(s), Some(p)) => Ok((s, p)),
        _ => Err(EngineError::Invalid("pipeline message without streams".into())),
    }
}

/// Sends the streams, pre_mix and the shared state later stages read; returns the send.
pub(super) fn send(c: &Config, stage: &Stage, crossing: &[(&'static str, i32)], streams: &Array, pre_mix: &Array, start: i32, shared: &Shared) -> Result<Array> {
    let (b, l) = (streams.dim(0), streams.dim(1));
    let mut data = Vec::new();
    for (key, shape, dtype) in layout(c, crossing, b, l, start, streams.dtype()) {
        let state = match key {
            "streams" => Some(streams.clone()),
            "pre_mix" => Some(pre_mix.clone()),
            "compress_kv" => shared.compress_kv.clone(),
            "index_k" => shared.index_k.clone(),
            "candidates" => shared.candidates.clone(),
            _ => shared.topk_idx.clone(),
        };
        let part = match state {
            // Not written yet, so the layout has no entries either.
            None => ops::zeros(&shape, dtype)?,
            // All entries so far: only the new ones.
            Some(p) if key == "compress_kv" || key == "index_k" => p.slice_axis(1, p.dim(1) - shape[1], p.dim(1))?,
            Some(p) if key == "candidates" => {
                let (n, blocks) = (p.dim(-1), c.candidate_block_size);
                p.slice(&[0, 0, 0], &[p.dim(0), p.dim(1), n], &[1, 1, blocks])?
            }
            Some(p) => p,
        };
        if part.shape() != shape || part.dtype() != dtype {
            return Err(EngineError::Invalid(format!(
                "the next pipeline stage expects {key} as {} {shape:?}, not {} {:?}",
                dtype.name(),
                part.dtype().name(),
                part.shape()
            )));
        }
        let flat = part.view(Dtype::U8)?.reshape(&[-1])?;
        let pad = nbytes(&shape, dtype) - flat.dim(0);
        data.push(if pad > 0 { flat.pad(&[(0, pad)], 0.0)? } else { flat });
    }
    stage.send(&ops::concatenate(&data.iter().collect::<Vec<_>>(), 0)?)
}

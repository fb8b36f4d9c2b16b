//! `nn.Linear` and `nn.QuantizedLinear`: y = x Wᵀ (+ b), W float or affine-quantized.
use super::quant::{QuantConfig, Quantized};
use crate::error::Result;
use crate::shard::{self, ShardMode};
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::{ops, Array};

#[derive(Clone)]
enum Kind {
    Float(Array), // (out, in)
    Quant(Quantized),
}

#[derive(Clone)]
pub struct Linear {
    kind: Kind,
    bias: Option<Array>, // (out,)
    /// Tensor parallel, sharded-to-all: the partial product is summed over this group before the bias.
    reduce: Option<Group>,
}

impl Linear {
    /// Loads `weight` (and `bias` when `bias`), quantized where the checkpoint has `scales`.
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, bias: bool, q: &QuantConfig) -> Result<Linear> {
        let kind = match q.layer(vb, in_dims)? {
            Some(spec) => Kind::Quant(Quantized::load(vb, out_dims, in_dims, spec)?),
            None => Kind::Float(vb.get("weight", &[out_dims, in_dims])?),
        };
        let bias = if bias { Some(vb.get("bias", &[out_dims])?) } else { None };
        Ok(Linear { kind, bias, reduce: None })
    }

    /// A float layer from its weight (out, in) and optional bias (out,).
    pub fn float(weight: Array, bias: Option<Array>) -> Linear {
        Linear { kind: Kind::Float(weight), bias, reduce: None }
    }

    /// One layer computing `parts` side by side (their outputs concatenated), when they are stored
    /// alike (all float, or all quantized with the same bits and group size); evaluated at once so
    /// the separate weights can be freed. Each output element is the same dot product as before.
    pub fn fuse(parts: &[&Linear]) -> Result<Option<Linear>> {
        let cat = |arrays: Vec<&Array>| -> Result<Array> { Ok(ops::concatenate(&arrays, 0)?) };
        let kind = match parts.iter().map(|p| &p.kind).collect::<Vec<_>>().as_slice() {
            [Kind::Float(_), ..] if parts.iter().all(|p| matches!(p.kind, Kind::Float(_))) => {
                Kind::Float(cat(parts.iter().filter_map(|p| match &p.kind {
                    Kind::Float(w) => Some(w),
                    Kind::Quant(_) => None,
                }).collect())?)
            }
            [Kind::Quant(first), ..] => {
                let qs: Vec<&Quantized> = parts
                    .iter()
                    .filter_map(|p| match &p.kind {
                        Kind::Quant(q) if q.spec == first.spec => Some(q),
                        _ => None,
                    })
                    .collect();
                if qs.len() != parts.len() {
                    return Ok(None);
                }
                Kind::Quant(Quantized::concat(&qs, first.spec)?)
            }
            _ => return Ok(None),
        };
        let bias = match parts.iter().map(|p| p.bias.as_ref()).collect::<Option<Vec<_>>>() {
            Some(b) => Some(cat(b)?),
            None if parts.iter().all(|p| p.bias.is_none()) => None,
            None => return Ok(None),
        };
        let fused = Linear { kind, bias, reduce: None };
        mlx::eval(&fused.arrays())?;
        Ok(Some(fused))
    }

    /// The number of outputs.
    pub fn out_dims(&self) -> i32 {
        match &self.kind {
            Kind::Float(w) => w.dim(0),
            Kind::Quant(q) => q.weight.dim(0),
        }
    }

    /// The weights this layer holds (for evaluation and memory accounting).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = match &self.kind {
            Kind::Float(w) => vec![w],
            Kind::Quant(q) => q.arrays().to_vec(),
        };
        v.extend(self.bias.iter());
        v
    }

    /// This rank's part of the layer for tensor parallel over `group` (mlx-lm's `shard_linear`).
    /// `segments`: the output sizes of the layers fused in this one (one entry when not fused),
    /// each split evenly for [`ShardMode::AllToSharded`]; unused for [`ShardMode::ShardedToAll`].
    pub fn shard(&self, mode: ShardMode, segments: &[i32], group: &Group) -> Result<Linear> {
        let (rank, size) = shard::place(group);
        let part = |a: &Array| match mode {
            ShardMode::AllToSharded => shard::rows(a, segments, rank, size),
            ShardMode::ShardedToAll => shard::cols(a, rank, size),
        };
        let kind = match &self.kind {
            Kind::Float(w) => Kind::Float(part(w)?),
            Kind::Quant(q) => Kind::Quant(q.map(part)?),
        };
        let (bias, reduce) = match mode {
            ShardMode::AllToSharded => (self.bias.as_ref().map(|b| shard::rows(b, segments, rank, size)).transpose()?, None),
            ShardMode::ShardedToAll => (self.bias.clone(), Some(group.clone())),
        };
        Ok(Linear { kind, bias, reduce })
    }

    /// As [`Linear::shard`], but a sharded-to-all layer does not sum over the group (mlx-lm's
    /// `shard_inplace`): its caller sums a whole block's partial outputs at once (DeepSeek's MoE).
    pub fn shard_inplace(&self, mode: ShardMode, segments: &[i32], group: &Group) -> Result<Linear> {
        Ok(Linear { reduce: None, ..self.shard(mode, segments, group)? })
    }

    /// mlx-lm's `repeat_kv_layer_inplace` before sharding: every array's output rows (weight,
    /// scales, biases, bias) as `heads` blocks, each `times` times in a row ([`shard::repeat_heads`]).
    pub fn repeat_heads(&self, heads: i32, times: i32) -> Result<Linear> {
        let rep = |a: &Array| shard::repeat_heads(a, heads, times);
        let kind = match &self.kind {
            Kind::Float(w) => Kind::Float(rep(w)?),
            Kind::Quant(q) => Kind::Quant(q.map(rep)?),
        };
        Ok(Linear { kind, bias: self.bias.as_ref().map(rep).transpose()?, reduce: self.reduce.clone() })
    }

    /// x (..., in) -> (..., out)
    pub fn forward(&self, x: &Array) -> Result<Array> {
        if let Some(group) = &self.reduce {
            let y = match &self.kind {
                Kind::Float(w) => x.matmul(&w.t()?)?,
                Kind::Quant(q) => q.matmul_t(x)?,
            };
            let y = group.all_sum(&y)?;
            return Ok(match &self.bias {
                Some(b) => y.add(b)?,
                None => y,
            });
        }
        match (&self.kind, &self.bias) {
            (Kind::Float(w), Some(b)) => Ok(ops::addmm(b, x, &w.t()?, 1.0, 1.0)?),
            (Kind::Float(w), None) => Ok(x.matmul(&w.t()?)?),
            (Kind::Quant(q), bias) => {
                let y = q.matmul_t(x)?;
                Ok(match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                })
            }
        }
    }
}

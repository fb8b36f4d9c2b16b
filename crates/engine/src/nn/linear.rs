//! `nn.Linear` and `nn.QuantizedLinear`: y = x Wᵀ (+ b), W float or affine-quantized.
use super::quant::{QuantConfig, Quantized};
use crate::error::Result;
use crate::shard::{self, ShardMode};
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::{ops, Array};

/// A layer's weight, float or affine-quantized: (out, in), or (experts, out, in) for stacked
/// experts ([`super::switch::SwitchLinear`]).
#[derive(Clone)]
pub(super) enum Weight {
    Float(Array),
    Quant(Quantized),
}

impl Weight {
    /// `parts` side by side along their output axis (-2), when they are stored alike (all float, or
    /// all quantized with the same bits and group size); `None` otherwise. Not evaluated.
    pub(super) fn concat(parts: &[&Weight]) -> Result<Option<Weight>> {
        Ok(Some(match parts {
            [Weight::Float(_), ..] => {
                let ws: Option<Vec<&Array>> = parts
                    .iter()
                    .map(|p| match p {
                        Weight::Float(w) => Some(w),
                        Weight::Quant(_) => None,
                    })
                    .collect();
                match ws {
                    Some(ws) => Weight::Float(ops::concatenate(&ws, -2)?),
                    None => return Ok(None),
                }
            }
            [Weight::Quant(first), ..] => {
                let qs: Option<Vec<&Quantized>> = parts
                    .iter()
                    .map(|p| match p {
                        Weight::Quant(q) if q.spec == first.spec => Some(q),
                        _ => None,
                    })
                    .collect();
                match qs {
                    Some(qs) => Weight::Quant(Quantized::concat(&qs, first.spec)?),
                    None => return Ok(None),
                }
            }
            [] => return Ok(None),
        }))
    }

    /// The same weight with `f` applied to each of its arrays (a shard, a slice).
    pub(super) fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Weight> {
        Ok(match self {
            Weight::Float(w) => Weight::Float(f(w)?),
            Weight::Quant(q) => Weight::Quant(q.map(f)?),
        })
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        match self {
            Weight::Float(w) => vec![w],
            Weight::Quant(q) => q.arrays(),
        }
    }
}

#[derive(Clone)]
pub struct Linear {
    kind: Weight,
    bias: Option<Array>, // (out,)
    /// Tensor parallel, sharded-to-all: the partial product is summed over this group before the bias.
    reduce: Option<Group>,
}

impl Linear {
    /// Loads `weight` (and `bias` when `bias`), quantized where the checkpoint has `scales`.
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, bias: bool, q: &QuantConfig) -> Result<Linear> {
        let kind = match q.layer(vb, in_dims)? {
            Some(spec) => Weight::Quant(Quantized::load(vb, out_dims, in_dims, spec)?),
            None => Weight::Float(vb.get("weight", &[out_dims, in_dims])?),
        };
        let bias = if bias { Some(vb.get("bias", &[out_dims])?) } else { None };
        Ok(Linear { kind, bias, reduce: None })
    }

    /// A float layer from its weight (out, in) and optional bias (out,).
    pub fn float(weight: Array, bias: Option<Array>) -> Linear {
        Linear { kind: Weight::Float(weight), bias, reduce: None }
    }

    /// One layer computing `parts` side by side (their outputs concatenated), when they are stored
    /// alike (all float, or all quantized with the same bits and group size); evaluated at once so
    /// the separate weights can be freed. Each output element is the same dot product as before.
    pub fn fuse(parts: &[&Linear]) -> Result<Option<Linear>> {
        let Some(kind) = Weight::concat(&parts.iter().map(|p| &p.kind).collect::<Vec<_>>())? else {
            return Ok(None);
        };
        let bias = match parts.iter().map(|p| p.bias.as_ref()).collect::<Option<Vec<_>>>() {
            Some(b) => Some(ops::concatenate(&b, 0)?),
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
            Weight::Float(w) => w.dim(0),
            Weight::Quant(q) => q.weight.dim(0),
        }
    }

    /// The weights this layer holds (for evaluation and memory accounting).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.kind.arrays();
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
        let kind = self.kind.map(part)?;
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
        let kind = self.kind.map(rep)?;
        Ok(Linear { kind, bias: self.bias.as_ref().map(rep).transpose()?, reduce: self.reduce.clone() })
    }

    /// x (..., in) -> (..., out)
    pub fn forward(&self, x: &Array) -> Result<Array> {
        if let Some(group) = &self.reduce {
            let y = match &self.kind {
                Weight::Float(w) => x.matmul(&w.t()?)?,
                Weight::Quant(q) => q.matmul_t(x)?,
            };
            let y = group.all_sum(&y)?;
            return Ok(match &self.bias {
                Some(b) => y.add(b)?,
                None => y,
            });
        }
        match (&self.kind, &self.bias) {
            (Weight::Float(w), Some(b)) => Ok(ops::addmm(b, x, &w.t()?, 1.0, 1.0)?),
            (Weight::Float(w), None) => Ok(x.matmul(&w.t()?)?),
            (Weight::Quant(q), bias) => {
                let y = q.matmul_t(x)?;
                Ok(match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                })
            }
        }
    }
}

impl super::gate_up::Projection for Linear {
    fn fuse(parts: &[&Self]) -> Result<Option<Self>> {
        Linear::fuse(parts)
    }
    fn arrays(&self) -> Vec<&Array> {
        Linear::arrays(self)
    }
    fn out_dims(&self) -> i32 {
        Linear::out_dims(self)
    }
    fn shard(&self, mode: ShardMode, segments: &[i32], group: &Group) -> Result<Self> {
        Linear::shard(self, mode, segments, group)
    }
}

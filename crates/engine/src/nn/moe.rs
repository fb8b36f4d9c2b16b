//! Mixture-of-experts layers as mlx-lm's `switch_layers.py`: experts stacked into one tensor and run
//! through MLX's gathered (quantized) matmul, so only the chosen experts' weights are read.
use super::quant::QuantConfig;
use super::Linear;
use crate::error::{EngineError, Result};
use crate::shard::{self, ShardMode};
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::ops::{self, QuantSpec};
use mlx::runtime::Device;
use mlx::{Array, Dtype};

/// mlx-lm's `sanitize` expert stacking: `{prefix}.experts.{e}.{m}.{k}` for every expert `e` becomes
/// `{prefix}.switch_mlp.{m}.{k}` (stacked on a new first axis), for m in gate/down/up projections
/// and k in weight/scales/biases, where expert 0 has it.
pub fn stack_experts(weights: &mut Weights, prefix: &str, n_experts: i32) -> Result<()> {
    for m in ["gate_proj", "down_proj", "up_proj"] {
        for k in ["weight", "scales", "biases"] {
            if !weights.contains(&format!("{prefix}.experts.0.{m}.{k}")) {
                continue;
            }
            let parts = (0..n_experts)
                .map(|e| {
                    let name = format!("{prefix}.experts.{e}.{m}.{k}");
                    weights.remove(&name).ok_or(EngineError::missing_tensor(name))
                })
                .collect::<Result<Vec<Array>>>()?;
            let stacked = ops::stack(&parts.iter().collect::<Vec<_>>(), 0)?;
            weights.insert(format!("{prefix}.switch_mlp.{m}.{k}"), stacked);
        }
    }
    Ok(())
}

#[derive(Clone)]
enum SwitchKind {
    Float(Array), // (experts, out, in)
    Quant { weight: Array, scales: Array, biases: Array, spec: QuantSpec },
}

/// `SwitchLinear` / `QuantizedSwitchLinear` without bias: one (out, in) matrix per expert.
#[derive(Clone)]
pub struct SwitchLinear(SwitchKind);

impl SwitchLinear {
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, experts: i32, q: &QuantConfig) -> Result<SwitchLinear> {
        Ok(SwitchLinear(match q.layer(vb, in_dims)? {
            Some(spec) => {
                let groups = in_dims / spec.group_size;
                SwitchKind::Quant {
                    weight: vb.get("weight", &[experts, out_dims, in_dims * spec.bits / 32])?,
                    scales: vb.get("scales", &[experts, out_dims, groups])?,
                    biases: vb.get("biases", &[experts, out_dims, groups])?,
                    spec,
                }
            }
            None => SwitchKind::Float(vb.get("weight", &[experts, out_dims, in_dims])?),
        }))
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            SwitchKind::Float(w) => vec![w],
            SwitchKind::Quant { weight, scales, biases, .. } => vec![weight, scales, biases],
        }
    }

    /// This rank's block of every expert (mlx-lm's `shard_inplace`): its output rows (axis -2) for
    /// all-to-sharded, its input columns (axis -1) for sharded-to-all; no sum over the group here.
    pub fn shard(&self, mode: ShardMode, group: &Group) -> Result<SwitchLinear> {
        let axis = if mode == ShardMode::AllToSharded { -2 } else { -1 };
        let part = |a: &Array| shard::block(a, axis, group.rank(), group.size());
        Ok(SwitchLinear(match &self.0 {
            SwitchKind::Float(w) => SwitchKind::Float(part(w)?),
            SwitchKind::Quant { weight, scales, biases, spec } => {
                SwitchKind::Quant { weight: part(weight)?, scales: part(scales)?, biases: part(biases)?, spec: *spec }
            }
        }))
    }

    /// x (..., 1, in) with expert `indices` -> (..., 1, out).
    pub fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(match &self.0 {
            SwitchKind::Float(w) => {
                let y = ops::gather_mm(x, &w.swapaxes(-1, -2)?, None, Some(indices), sorted)?;
                // MLX's CPU kernel fails at evaluation with an internal message otherwise.
                if y.dtype() != Dtype::F32 && mlx::runtime::default_device() == Device::Cpu {
                    return Err(EngineError::Invalid(format!(
                        "this model's unquantized mixture-of-experts layers compute in {}, which MLX runs only \
                         in float32 on the CPU: use a GPU, or a quantized or float32 copy of the model \
                         (mlx_lm.convert -q, or --dtype float32)",
                        y.dtype().name()
                    )));
                }
                y
            }
            SwitchKind::Quant { weight, scales, biases, spec } => {
                ops::gather_qmm(x, weight, scales, Some(biases), Some(indices), true, *spec, sorted)?
            }
        })
    }
}

/// `SwitchGLU` with the default `SwiGLU` activation and no biases.
#[derive(Clone)]
pub struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
}

impl SwitchGlu {
    pub fn load(vb: &Vb<'_>, dims: i32, hidden: i32, experts: i32, q: &QuantConfig) -> Result<SwitchGlu> {
        Ok(SwitchGlu {
            gate_proj: SwitchLinear::load(&vb.pp("gate_proj"), dims, hidden, experts, q)?,
            up_proj: SwitchLinear::load(&vb.pp("up_proj"), dims, hidden, experts, q)?,
            down_proj: SwitchLinear::load(&vb.pp("down_proj"), hidden, dims, experts, q)?,
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        [self.gate_proj.arrays(), self.up_proj.arrays(), self.down_proj.arrays()].concat()
    }

    /// This rank's block of every expert's hidden units; the caller sums the outputs over `group`.
    pub fn shard(&self, group: &Group) -> Result<SwitchGlu> {
        Ok(SwitchGlu {
            gate_proj: self.gate_proj.shard(ShardMode::AllToSharded, group)?,
            up_proj: self.up_proj.shard(ShardMode::AllToSharded, group)?,
            down_proj: self.down_proj.shard(ShardMode::ShardedToAll, group)?,
        })
    }

    /// x (B, L, dims), indices (B, L, k) -> (B, L, k, dims): each token through each chosen expert.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims(&[-2, -3])?; // (B, L, 1, 1, dims)
        // With many tokens, sort them by expert so each expert's weights are read in order.
        let do_sort = indices.size() >= 64;
        let (x, idx, inv_order) = if do_sort {
            // _gather_sort
            let m = indices.dim(-1);
            let flat = indices.reshape(&[-1])?;
            let order = flat.argsort(-1)?;
            let inv_order = order.argsort(-1)?;
            let xs = x.reshape(&[-1, x.dim(-2), x.dim(-1)])?; // flatten(0, -3)
            let xs = xs.take(&order.floor_divide_scalar(f64::from(m))?, 0)?;
            (xs, flat.take(&order, 0)?, Some(inv_order))
        } else {
            (x, indices.clone(), None)
        };
        let x_up = self.up_proj.forward(&x, &idx, do_sort)?;
        let x_gate = self.gate_proj.forward(&x, &idx, do_sort)?;
        let y = self.down_proj.forward(&mlx::fast::swiglu(&x_gate, &x_up)?, &idx, do_sort)?;
        let y = match inv_order {
            Some(inv) => {
                // _scatter_unsort, then unflatten to (B, L, k, 1, dims)
                let y = y.take(&inv, 0)?;
                let mut shape = indices.shape();
                shape.extend([y.dim(-2), y.dim(-1)]);
                y.reshape(&shape)?
            }
            None => y,
        };
        Ok(y.squeeze(&[-2])?)
    }
}

/// A SwiGLU MLP without biases, `down(silu(gate(x)) * up(x))`: DeepSeek's dense layers and shared
/// experts.
#[derive(Clone)]
pub struct GluMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl GluMlp {
    pub fn load(vb: &Vb<'_>, dims: i32, hidden: i32, q: &QuantConfig) -> Result<GluMlp> {
        Ok(GluMlp {
            gate_proj: Linear::load(&vb.pp("gate_proj"), dims, hidden, false, q)?,
            up_proj: Linear::load(&vb.pp("up_proj"), dims, hidden, false, q)?,
            down_proj: Linear::load(&vb.pp("down_proj"), hidden, dims, false, q)?,
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        [self.gate_proj.arrays(), self.up_proj.arrays(), self.down_proj.arrays()].concat()
    }

    /// This rank's block of the hidden units for tensor parallel over `group`; with `reduce` the
    /// output is summed over the group (a dense layer), without it the caller sums (shared experts).
    pub fn shard(&self, group: &Group, reduce: bool) -> Result<GluMlp> {
        let down = if reduce { Linear::shard } else { Linear::shard_inplace };
        Ok(GluMlp {
            gate_proj: self.gate_proj.shard(ShardMode::AllToSharded, &[self.gate_proj.out_dims()], group)?,
            up_proj: self.up_proj.shard(ShardMode::AllToSharded, &[self.up_proj.out_dims()], group)?,
            down_proj: down(&self.down_proj, ShardMode::ShardedToAll, &[], group)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&mlx::fast::swiglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?)
    }
}

/// A mixture-of-experts router: x (B, L, hidden) -> expert indices and their weights, each (B, L, k).
pub trait Router: Clone {
    fn route(&self, x: &Array) -> Result<(Array, Array)>;
    fn arrays(&self) -> Vec<&Array>;
}

/// DeepSeek's feed-forward part: a dense SwiGLU MLP, or routed experts (`SwitchGLU`) with optional
/// shared experts, as deepseek_v2.py's and deepseek_v3.py's `MoE`.
#[derive(Clone)]
pub enum Ffn<R> {
    Dense(GluMlp),
    /// `reduce`: tensor parallel, the experts' outputs summed over the group once.
    Moe { gate: R, switch_mlp: SwitchGlu, shared_experts: Option<GluMlp>, reduce: Option<Group> },
}

impl<R: Router> Ffn<R> {
    /// `vb.switch_mlp` with `experts` experts of `hidden` units, and `vb.shared_experts` of
    /// `n_shared * hidden` units where the model has shared experts.
    #[allow(clippy::too_many_arguments)]
    pub fn moe(vb: &Vb<'_>, gate: R, dims: i32, hidden: i32, experts: i32, n_shared: Option<i32>, q: &QuantConfig) -> Result<Ffn<R>> {
        Ok(Ffn::Moe {
            gate,
            switch_mlp: SwitchGlu::load(&vb.pp("switch_mlp"), dims, hidden, experts, q)?,
            shared_experts: n_shared.map(|n| GluMlp::load(&vb.pp("shared_experts"), dims, hidden * n, q)).transpose()?,
            reduce: None,
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Ffn::Dense(m) => m.arrays(),
            Ffn::Moe { gate, switch_mlp, shared_experts, .. } => {
                let mut v = gate.arrays();
                v.extend(switch_mlp.arrays());
                v.extend(shared_experts.iter().flat_map(|s| s.arrays()));
                v
            }
        }
    }

    /// The routed and shared experts keep this rank's block of hidden units and their sum is
    /// summed over the group once (mlx-lm's `sharding_group`); the router stays whole.
    pub fn shard(&self, group: &Group) -> Result<Ffn<R>> {
        Ok(match self {
            Ffn::Dense(m) => Ffn::Dense(m.shard(group, true)?),
            Ffn::Moe { gate, switch_mlp, shared_experts, .. } => Ffn::Moe {
                gate: gate.clone(),
                switch_mlp: switch_mlp.shard(group)?,
                shared_experts: shared_experts.as_ref().map(|s| s.shard(group, false)).transpose()?,
                reduce: Some(group.clone()),
            },
        })
    }

    /// x (B, L, hidden) -> (B, L, hidden).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe { gate, switch_mlp, shared_experts, reduce } => {
                let (inds, scores) = gate.route(x)?;
                let y = switch_mlp.forward(x, &inds)?; // (B, L, k, hidden)
                // deepseek_v3's float32 scores cast back (a no-op for deepseek_v2's).
                let y = y.mul(&scores.expand_dims(&[-1])?)?.sum(&[-2], false)?.astype(y.dtype())?;
                let y = match shared_experts {
                    Some(s) => y.add(&s.forward(x)?)?,
                    None => y,
                };
                match reduce {
                    Some(g) => Ok(g.all_sum(&y)?),
                    None => Ok(y),
                }
            }
        }
    }
}

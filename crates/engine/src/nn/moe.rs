//! Mixture-of-experts layers as mlx-lm's `switch_layers.py`: experts stacked into one tensor and run
//! through MLX's gathered (quantized) matmul, so only the chosen experts' weights are read.
use super::quant::{QuantConfig, Quantized};
use super::Linear;
use crate::error::{EngineError, Result};
use crate::shard::{self, ShardMode};
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::ops;
use mlx::runtime::Device;
use mlx::{Array, Dtype};

/// mlx-lm's `sanitize` expert stacking: `{prefix}.experts.{e}.{m}.{k}` for every expert `e` becomes
/// `{prefix}.switch_mlp.{m}.{k}` (stacked on a new first axis), for m in gate/down/up projections
/// and k in weight/scales/biases, where expert 0 has it.
pub fn stack_experts(weights: &mut Weights, prefix: &str, n_experts: i32) -> Result<()> {
    let names = [("gate_proj", "gate_proj"), ("down_proj", "down_proj"), ("up_proj", "up_proj")];
    stack_experts_as(weights, prefix, n_experts, &names)
}

/// As [`stack_experts`] with the experts' own projection names: `{prefix}.experts.{e}.{from}.{k}`
/// becomes `{prefix}.switch_mlp.{to}.{k}` for each `(from, to)` (Mixtral's w1/w2/w3).
pub fn stack_experts_as(weights: &mut Weights, prefix: &str, n_experts: i32, names: &[(&str, &str)]) -> Result<()> {
    for (from, to) in names {
        for k in ["weight", "scales", "biases"] {
            if !weights.contains(&format!("{prefix}.experts.0.{from}.{k}")) {
                continue;
            }
            let parts = (0..n_experts)
                .map(|e| {
                    let name = format!("{prefix}.experts.{e}.{from}.{k}");
                    weights.remove(&name).ok_or(EngineError::missing_tensor(name))
                })
                .collect::<Result<Vec<Array>>>()?;
            let stacked = ops::stack(&parts.iter().collect::<Vec<_>>(), 0)?;
            weights.insert(format!("{prefix}.switch_mlp.{to}.{k}"), stacked);
        }
    }
    Ok(())
}

#[derive(Clone)]
enum SwitchKind {
    Float(Array), // (experts, out, in)
    Quant(Quantized),
}

/// `SwitchLinear` / `QuantizedSwitchLinear` without bias: one (out, in) matrix per expert.
#[derive(Clone)]
pub struct SwitchLinear(SwitchKind);

impl SwitchLinear {
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, experts: i32, q: &QuantConfig) -> Result<SwitchLinear> {
        Ok(SwitchLinear(match q.layer(vb, in_dims)? {
            Some(spec) => SwitchKind::Quant(Quantized::load_stacked(vb, &[experts], out_dims, in_dims, spec)?),
            None => SwitchKind::Float(vb.get("weight", &[experts, out_dims, in_dims])?),
        }))
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            SwitchKind::Float(w) => vec![w],
            SwitchKind::Quant(q) => q.arrays(),
        }
    }

    /// x (n, in) through expert `e` alone -> (n, out): a plain (quantized) product over that
    /// expert's slice of the stack, which takes the device's fastest product for n rows.
    fn forward_expert(&self, x: &Array, e: i32) -> Result<Array> {
        let one = |a: &Array| -> Result<Array> { Ok(a.slice_axis(0, e, e + 1)?.squeeze(&[0])?) };
        match &self.0 {
            SwitchKind::Float(w) => Ok(x.matmul(&one(w)?.t()?)?),
            SwitchKind::Quant(q) => q.map(one)?.matmul_t(x),
        }
    }

    /// The number of experts stacked.
    fn experts(&self) -> i32 {
        match &self.0 {
            SwitchKind::Float(w) => w.dim(0),
            SwitchKind::Quant(q) => q.weight.dim(0),
        }
    }

    /// This rank's block of every expert (mlx-lm's `shard_inplace`): its output rows (axis -2) for
    /// all-to-sharded, its input columns (axis -1) for sharded-to-all; no sum over the group here.
    pub fn shard(&self, mode: ShardMode, group: &Group) -> Result<SwitchLinear> {
        let axis = if mode == ShardMode::AllToSharded { -2 } else { -1 };
        let part = |a: &Array| shard::block(a, axis, group.rank(), group.size());
        Ok(SwitchLinear(match &self.0 {
            SwitchKind::Float(w) => SwitchKind::Float(part(w)?),
            SwitchKind::Quant(q) => SwitchKind::Quant(q.map(part)?),
        }))
    }

    /// This rank's block of the experts themselves (axis 0: mlx-lm's `shard_inplace` with the
    /// segments on axis 0), each kept whole.
    pub fn shard_experts(&self, group: &Group) -> Result<SwitchLinear> {
        let part = |a: &Array| shard::block(a, 0, group.rank(), group.size());
        Ok(SwitchLinear(match &self.0 {
            SwitchKind::Float(w) => SwitchKind::Float(part(w)?),
            SwitchKind::Quant(q) => SwitchKind::Quant(q.map(part)?),
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
            SwitchKind::Quant(q) => {
                ops::gather_qmm(x, &q.weight, &q.scales, q.biases.as_ref(), Some(indices), true, q.spec, sorted)?
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
        self.forward_with(x, indices, |up, gate| Ok(mlx::fast::swiglu(gate, up)?))
    }

    /// [`SwitchGlu::forward`] with the activation `act(up, gate)` (a `SwitchGLU(activation=...)`).
    pub fn forward_with(&self, x: &Array, indices: &Array, act: impl Fn(&Array, &Array) -> Result<Array>) -> Result<Array> {
        // With many tokens, sort them by expert so each expert's weights are read in order.
        let do_sort = indices.size() >= 64;
        if do_sort && self.grouped_pays(indices) {
            return self.forward_grouped(x, indices, &act);
        }
        if !do_sort {
            if let Some((up, gate, down)) = self.gathered_experts() {
                return Self::forward_gathered((up, gate, down), x, indices, &act);
            }
        }
        let (x, idx, inv_order) = if do_sort {
            let (xs, sorted, inv_order) = gather_sort(x, indices)?;
            (xs.expand_dims(&[-2])?, sorted, Some(inv_order)) // (N, 1, dims)
        } else {
            (x.expand_dims(&[-2, -3])?, indices.clone(), None) // (B, L, 1, 1, dims)
        };
        let x_up = self.up_proj.forward(&x, &idx, do_sort)?;
        let x_gate = self.gate_proj.forward(&x, &idx, do_sort)?;
        let y = self.down_proj.forward(&act(&x_up, &x_gate)?, &idx, do_sort)?;
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

/// mlx-lm's `_gather_sort`: x (B, L, dims) and indices (B, L, k) -> each slot's (token, chosen
/// expert) row of x sorted by expert (N, dims), the sorted experts (N,), and the order that puts
/// the slots back (N,), N = B * L * k.
fn gather_sort(x: &Array, indices: &Array) -> Result<(Array, Array, Array)> {
    let k = indices.dim(-1);
    let flat = indices.reshape(&[-1])?; // (N,)
    let order = flat.argsort(-1)?;
    let inv_order = order.argsort(-1)?;
    let xs = x.reshape(&[-1, x.dim(-1)])?.take(&order.floor_divide_scalar(f64::from(k))?, 0)?; // (N, dims)
    Ok((xs, flat.take(&order, 0)?, inv_order))
}

/// Prompt positions from which a chunk's experts may run grouped ([`SwitchGlu::forward_grouped`]):
/// never a decode step, a batch step or a speculative verification, whose pipelining a host read
/// would break.
const GROUPED_MIN_TOKENS: usize = 64;

impl SwitchGlu {
    /// Whether a prompt chunk's tokens run through their experts one expert at a time
    /// ([`SwitchGlu::forward_grouped`]): `MLX_GEN_MOE_GROUPED=1`, for a chunk of 64+ positions
    /// with 16+ slots an expert on average. Off by default until measured on the GPU, where MLX
    /// 0.32.4's gathered product of a sorted prompt is slow (Mixtral-8x7B's 512-token prompt: 2.4 s
    /// in mlx-lm and here, BENCHMARKS.md 2026-12-07c).
    fn grouped_pays(&self, indices: &Array) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("MLX_GEN_MOE_GROUPED").is_ok_and(|v| v == "1"));
        let k = indices.dim(-1).max(1) as usize;
        let experts = self.down_proj.experts().max(1) as usize;
        on && indices.size() / k >= GROUPED_MIN_TOKENS && indices.size() / experts >= 16
    }

    /// [`SwitchGlu::forward_with`] for a prompt chunk, one expert at a time: the slots (token,
    /// chosen expert) sorted by expert as mlx-lm's `_gather_sort`, the sorted experts read to the
    /// host (one device round trip a layer), then each expert's run of slots through a plain
    /// product of that expert's weights (MLX's tiled product, or the dequantized weight and the
    /// dense product for long runs), and the outputs put back in the slots' order: the gathered
    /// product's values up to the products' order of summation. x (B, L, dims), indices (B, L, k)
    /// -> (B, L, k, dims).
    fn forward_grouped(&self, x: &Array, indices: &Array, act: &impl Fn(&Array, &Array) -> Result<Array>) -> Result<Array> {
        let (xs, sorted, inv_order) = gather_sort(x, indices)?;
        let sorted: Vec<u32> = sorted.astype(Dtype::U32)?.to_vec()?;
        let mut outs = Vec::new();
        let mut start = 0;
        while start < sorted.len() {
            let e = sorted[start];
            let end = start + sorted[start..].iter().take_while(|&&v| v == e).count();
            let e = i32::try_from(e).map_err(|_| EngineError::Invalid(format!("expert index {e} out of range")))?;
            let xe = xs.slice_axis(0, start as i32, end as i32)?; // (n_e, dims)
            let h = act(&self.up_proj.forward_expert(&xe, e)?, &self.gate_proj.forward_expert(&xe, e)?)?; // (n_e, hidden)
            outs.push(self.down_proj.forward_expert(&h, e)?); // (n_e, dims)
            start = end;
        }
        let y = ops::concatenate(&outs.iter().collect::<Vec<_>>(), 0)?.take(&inv_order, 0)?; // (N, dims)
        let mut shape = indices.shape();
        shape.push(y.dim(-1));
        Ok(y.reshape(&shape)?) // (B, L, k, dims)
    }

    /// The up, gate and down experts where all three take [`mlx::fast::gather_qmm_rows`]'s kernel
    /// ([`Quantized::gathered_rows_pay`]).
    fn gathered_experts(&self) -> Option<(&Quantized, &Quantized, &Quantized)> {
        match (&self.up_proj.0, &self.gate_proj.0, &self.down_proj.0) {
            (SwitchKind::Quant(up), SwitchKind::Quant(gate), SwitchKind::Quant(down))
                if up.gathered_rows_pay() && gate.gathered_rows_pay() && down.gathered_rows_pay() =>
            {
                Some((up, gate, down))
            }
            _ => None,
        }
    }

    /// [`SwitchGlu::forward_with`] for a few tokens through [`mlx::fast::gather_qmm_rows`]: one
    /// kernel a projection, each slot (token, chosen expert) reading only its expert's weight.
    fn forward_gathered(
        (up, gate, down): (&Quantized, &Quantized, &Quantized),
        x: &Array,
        indices: &Array,
        act: &impl Fn(&Array, &Array) -> Result<Array>,
    ) -> Result<Array> {
        let k = indices.dim(-1);
        let t = (indices.size() / k.max(1) as usize) as i32;
        let x2 = x.reshape(&[t, x.dim(-1)])?; // (T, dims)
        let idx = indices.reshape(&[t, k])?.astype(Dtype::U32)?; // (T, k)
        let rows = |q: &Quantized, x: &Array| mlx::fast::gather_qmm_rows(x, &q.weight, &q.scales, q.biases.as_ref(), &idx, q.spec);
        let h = act(&rows(up, &x2)?, &rows(gate, &x2)?)?; // (T, k, hidden)
        let y = rows(down, &h.reshape(&[t * k, h.dim(-1)])?)?; // (T, k, dims)
        let mut shape = indices.shape();
        shape.push(y.dim(-1));
        Ok(y.reshape(&shape)?) // (B, L, k, dims)
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
    /// The weight of the shared experts' output for x (B, L, hidden), (B, L, 1), where the model
    /// gates it (qwen2_moe's `sigmoid(shared_expert_gate(x))`); `None`: added as it is.
    fn shared_gate(&self, x: &Array) -> Result<Option<Array>> {
        let _ = x;
        Ok(None)
    }
}

/// How a router turns its logits into scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scoring {
    Softmax,
    Sigmoid,
}

/// How group-limited routing rates a group of experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GroupScore {
    /// Its best expert's score (deepseek_v2).
    Max,
    /// The sum of its two best scores (deepseek_v3, mistral4).
    TopTwoSum,
}

/// The routing of one mixture-of-experts family, as data: every variant mlx-lm's files use.
#[derive(Clone, Debug)]
pub struct Routing {
    pub top_k: i32,
    pub scoring: Scoring,
    /// Score the logits cast to float32 (`gates.astype(mx.float32)`); otherwise in their dtype
    /// with a precise softmax.
    pub float32: bool,
    /// Mixtral: choose the top-k logits first, then softmax over the chosen ones alone.
    pub score_after_select: bool,
    /// qwen3_moe's `argpartition(gates, kth=-k)[..., -k:]` rather than the others'
    /// `argpartition(-gates, kth=k-1)[..., :k]` (the same experts, in another order).
    pub select_from_top: bool,
    /// `(n_group, topk_group, rating)`: the weakest `n_group - topk_group` groups are zeroed
    /// before the top-k choice.
    pub groups: Option<(i32, i32, GroupScore)>,
    /// Divide the chosen weights by their sum (plus `normalize_eps` where given).
    pub normalize: bool,
    pub normalize_eps: Option<f64>,
    /// `routed_scaling_factor`, multiplied last where the model has one.
    pub scaling: Option<f64>,
}

impl Routing {
    /// Top-k over the last axis of softmax scores, nothing else (qwen2_moe).
    pub fn softmax_top_k(top_k: i32) -> Routing {
        Routing {
            top_k,
            scoring: Scoring::Softmax,
            float32: false,
            score_after_select: false,
            select_from_top: false,
            groups: None,
            normalize: false,
            normalize_eps: None,
            scaling: None,
        }
    }

    /// The `k` best along the last axis of `s`.
    fn select(&self, s: &Array) -> Result<Array> {
        let k = self.top_k;
        Ok(if self.select_from_top {
            let n = s.dim(-1);
            s.argpartition(n - k, -1)?.slice_axis(-1, n - k, n)?
        } else {
            s.neg()?.argpartition(k - 1, -1)?.slice_axis(-1, 0, k)?
        })
    }
}

/// The router every mixture-of-experts file here uses: the `gate` projection (experts, hidden),
/// DeepSeek-V3's `e_score_correction_bias`, qwen2_moe's `shared_expert_gate`, and [`Routing`].
#[derive(Clone)]
pub struct Gate {
    proj: Linear,                       // (experts, hidden)
    correction_bias: Option<Array>,     // (experts,)
    shared_expert_gate: Option<Linear>, // (1, hidden)
    routing: Routing,
}

impl Gate {
    /// `gate` as an `nn.Linear` without bias (quantized where the checkpoint has it), optionally
    /// `shared_expert_gate` beside it.
    pub fn load(vb: &Vb<'_>, hidden: i32, experts: i32, routing: Routing, shared_gate: bool, q: &QuantConfig) -> Result<Gate> {
        Gate::check(experts, &routing)?;
        Ok(Gate {
            proj: Linear::load(&vb.pp("gate"), hidden, experts, false, q)?,
            correction_bias: None,
            shared_expert_gate: shared_gate.then(|| Linear::load(&vb.pp("shared_expert_gate"), hidden, 1, false, q)).transpose()?,
            routing,
        })
    }

    /// DeepSeek's `MoEGate`: a plain float `gate.weight` (never quantized), and with
    /// `correction_bias` its `gate.e_score_correction_bias`.
    pub fn load_float(vb: &Vb<'_>, hidden: i32, experts: i32, routing: Routing, correction_bias: bool) -> Result<Gate> {
        Gate::check(experts, &routing)?;
        let bias = correction_bias.then(|| vb.get("gate.e_score_correction_bias", &[experts])).transpose()?;
        Ok(Gate {
            proj: Linear::float(vb.get("gate.weight", &[experts, hidden])?, None),
            correction_bias: bias,
            shared_expert_gate: None,
            routing,
        })
    }

    fn check(experts: i32, r: &Routing) -> Result<()> {
        if r.top_k < 1 || r.top_k > experts {
            return Err(EngineError::Config(format!("{} experts per token out of {experts} experts", r.top_k)));
        }
        if let Some((g, t, _)) = r.groups {
            if g < 1 || experts % g != 0 || t < 0 || t > g {
                return Err(EngineError::Config(format!("n_group {g} / topk_group {t} do not fit {experts} experts")));
            }
        }
        Ok(())
    }
}

impl Router for Gate {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let r = &self.routing;
        let gates = self.proj.forward(x)?; // (B, L, experts)
        let gates = if r.float32 { gates.astype(Dtype::F32)? } else { gates };
        if r.score_after_select {
            let inds = r.select(&gates)?;
            let scores = gates.take_along_axis(&inds, -1)?.softmax(&[-1], true)?;
            return Ok((inds, scores));
        }
        let scores = match r.scoring {
            Scoring::Softmax => gates.softmax(&[-1], !r.float32)?,
            Scoring::Sigmoid => gates.sigmoid()?,
        };
        let mut choice = match &self.correction_bias {
            Some(b) => scores.add(b)?,
            None => scores.clone(),
        };
        if let Some((n_group, topk_group, rating)) = r.groups {
            let mut shape = choice.shape();
            shape.pop();
            choice = choice.reshape(&[shape.clone(), vec![n_group, -1]].concat())?; // (B, L, groups, per group)
            let group_scores = match rating {
                GroupScore::Max => choice.max(&[-1], true)?,
                GroupScore::TopTwoSum => choice.topk(2, -1)?.sum(&[-1], true)?,
            };
            let k = n_group - topk_group;
            if k > 0 {
                let group_idx = group_scores.argpartition(k - 1, -2)?.slice_axis(-2, 0, k)?;
                choice = choice.put_along_axis(&group_idx, &Array::scalar(0.0, choice.dtype())?, -2)?;
            }
            choice = choice.reshape(&[shape, vec![-1]].concat())?;
        }
        let inds = r.select(&choice)?;
        let mut scores = scores.take_along_axis(&inds, -1)?;
        if r.normalize {
            let sum = scores.sum(&[-1], true)?;
            let sum = match r.normalize_eps {
                Some(eps) => sum.add_scalar(eps)?,
                None => sum,
            };
            scores = scores.div(&sum)?;
        }
        if let Some(f) = r.scaling {
            scores = scores.mul_scalar(f)?;
        }
        Ok((inds, scores))
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.proj.arrays();
        v.extend(self.correction_bias.iter());
        v.extend(self.shared_expert_gate.iter().flat_map(|g| g.arrays()));
        v
    }

    fn shared_gate(&self, x: &Array) -> Result<Option<Array>> {
        match &self.shared_expert_gate {
            Some(g) => Ok(Some(g.forward(x)?.sigmoid()?)), // (B, L, 1)
            None => Ok(None),
        }
    }
}

/// The feed-forward part of a mixture-of-experts model's layer: a dense SwiGLU MLP, or routed
/// experts (`SwitchGLU`) with optional shared experts (gated where the router says so), as the
/// `MoE` / `SparseMoeBlock` modules of deepseek_v2/v3, qwen2_moe, qwen3_moe, mixtral and mistral4.
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
                    Some(s) => match gate.shared_gate(x)? {
                        Some(g) => y.add(&g.mul(&s.forward(x)?)?)?,
                        None => y.add(&s.forward(x)?)?,
                    },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate whose projection is the identity, so the logits are x itself.
    fn gate(routing: Routing) -> Gate {
        let eye: Vec<f32> = (0..16).map(|i| if i % 5 == 0 { 1.0 } else { 0.0 }).collect();
        Gate { proj: Linear::float(Array::from_slice(&eye, &[4, 4]).unwrap(), None), correction_bias: None, shared_expert_gate: None, routing }
    }

    fn route(g: &Gate, logits: [f32; 4]) -> (Vec<u32>, Vec<f32>) {
        let (i, s) = g.route(&Array::from_slice(&logits, &[1, 1, 4]).unwrap()).unwrap();
        let mut pairs: Vec<(u32, f32)> = i.to_vec::<u32>().unwrap().into_iter().zip(s.to_vec::<f32>().unwrap()).collect();
        pairs.sort_by_key(|p| p.0);
        pairs.into_iter().unzip()
    }

    #[test]
    fn top_k_variants_pick_the_same_experts() {
        let logits = [0.5, 2.0, -1.0, 1.0];
        let plain = route(&gate(Routing::softmax_top_k(2)), logits);
        let from_top = route(&gate(Routing { select_from_top: true, ..Routing::softmax_top_k(2) }), logits);
        assert_eq!(plain.0, [1, 3]);
        assert_eq!(plain, from_top);
        // Softmax over all four, not renormalised: the two weights sum to less than 1.
        assert!(plain.1.iter().sum::<f32>() < 0.99);
        let norm = route(&gate(Routing { normalize: true, ..Routing::softmax_top_k(2) }), logits);
        assert!((norm.1.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn mixtral_softmaxes_the_chosen_logits_only() {
        let (i, s) = route(&gate(Routing { score_after_select: true, ..Routing::softmax_top_k(2) }), [0.5, 2.0, -1.0, 1.0]);
        assert_eq!(i, [1, 3]);
        let e = (-1.0f32).exp();
        assert!((s[0] - 1.0 / (1.0 + e)).abs() < 1e-6 && (s[1] - e / (1.0 + e)).abs() < 1e-6, "{s:?}");
    }

    #[test]
    fn group_limits_and_scaling() {
        // Groups {0, 1} and {2, 3}: the best two experts are 0 and 2, but only the best group
        // (by its best expert) stays, so 0 and 1.
        let logits = [3.0, 0.0, 2.9, 2.8];
        assert_eq!(route(&gate(Routing::softmax_top_k(2)), logits).0, [0, 2]);
        let r = Routing { groups: Some((2, 1, GroupScore::Max)), scaling: Some(2.0), ..Routing::softmax_top_k(2) };
        let (i, s) = route(&gate(r), logits);
        assert_eq!(i, [0, 1]);
        let unscaled = route(&gate(Routing::softmax_top_k(4)), logits).1;
        assert!((s[0] - 2.0 * unscaled[0]).abs() < 1e-6 && (s[1] - 2.0 * unscaled[1]).abs() < 1e-6);
        // Rated by the sum of their two best, group {2, 3} wins instead.
        let r = Routing { groups: Some((2, 1, GroupScore::TopTwoSum)), ..Routing::softmax_top_k(2) };
        assert_eq!(route(&gate(r), logits).0, [2, 3]);
    }

    #[test]
    fn bad_routing_is_a_config_error() {
        assert!(Gate::check(8, &Routing::softmax_top_k(9)).is_err());
        assert!(Gate::check(8, &Routing { groups: Some((3, 1, GroupScore::Max)), ..Routing::softmax_top_k(2) }).is_err());
        assert!(Gate::check(8, &Routing { groups: Some((4, 2, GroupScore::TopTwoSum)), ..Routing::softmax_top_k(2) }).is_ok());
    }

    #[test]
    fn grouped_path_equals_the_sorted_gathered_product() {
        // 4 experts of SwiGLU (dims 64, hidden 32), float32 and 4-bit; 40 tokens choosing 2
        // experts each (expert 1 never chosen): one expert at a time equals MLX's sorted
        // gathered product, and the output comes back in the slots' order.
        let (t, k) = (40, 2);
        let x = Array::from_slice(&(0..t * 64).map(|i| ((i * 5 % 23) as f32 - 11.0) / 16.0).collect::<Vec<_>>(), &[1, t, 64]).unwrap();
        let picks: Vec<u32> = (0..t * k).map(|i| [0u32, 2, 3][(i as usize * 7 / 3) % 3]).collect();
        let idx = Array::from_slice(&picks, &[1, t, k]).unwrap();
        let float = |out: i32, inp: i32, salt: usize| {
            let n = (4 * out * inp) as usize;
            Array::from_slice(&(0..n).map(|i| (((i * 7 + salt) % 13) as f32 - 6.0) / 8.0).collect::<Vec<_>>(), &[4, out, inp]).unwrap()
        };
        let q = mlx::ops::QuantSpec::affine(32, 4);
        let quant = |w: Array| {
            let (weight, scales, biases) = mlx::ops::quantize(&w, q).unwrap();
            SwitchLinear(SwitchKind::Quant(Quantized { weight, scales, biases, spec: q }))
        };
        let act = |up: &Array, gate: &Array| Ok(mlx::fast::swiglu(gate, up)?);
        for quantized in [false, true] {
            let make = |out, inp, salt| if quantized { quant(float(out, inp, salt)) } else { SwitchLinear(SwitchKind::Float(float(out, inp, salt))) };
            let glu = SwitchGlu { gate_proj: make(32, 64, 1), up_proj: make(32, 64, 2), down_proj: make(64, 32, 3) };
            let want = glu.forward(&x, &idx).unwrap().to_vec::<f32>().unwrap();
            let got = glu.forward_grouped(&x, &idx, &act).unwrap();
            assert_eq!(got.shape(), vec![1, t, k, 64]);
            let got = got.to_vec::<f32>().unwrap();
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= 1e-5 * scale, "quantized {quantized}: {worst} against {scale}");
        }
    }

    #[test]
    fn gathered_path_equals_mlx_gathered_product() {
        // 4 experts of SwiGLU (dims 64, hidden 32) in 4 bits; 3 tokens choosing 2 experts each.
        // The few-token path through gather_qmm_rows (MLX's gathered product where its kernel does
        // not run, as here) gives forward_with's MLX path exactly.
        let q = mlx::ops::QuantSpec::affine(32, 4);
        let expert = |out: i32, inp: i32, salt: usize| {
            let n = (4 * out * inp) as usize;
            let w = Array::from_slice(&(0..n).map(|i| (((i * 7 + salt) % 13) as f32 - 6.0) / 8.0).collect::<Vec<_>>(), &[4, out, inp]).unwrap();
            let (weight, scales, biases) = mlx::ops::quantize(&w, q).unwrap();
            SwitchLinear(SwitchKind::Quant(Quantized { weight, scales, biases, spec: q }))
        };
        let glu = SwitchGlu { gate_proj: expert(32, 64, 1), up_proj: expert(32, 64, 2), down_proj: expert(64, 32, 3) };
        let x = Array::from_slice(&(0..192).map(|i| ((i % 17) as f32 - 8.0) / 16.0).collect::<Vec<_>>(), &[1, 3, 64]).unwrap();
        let idx = Array::from_slice(&[0u32, 3, 2, 1, 3, 2], &[1, 3, 2]).unwrap();
        let want = glu.forward(&x, &idx).unwrap();
        let SwitchGlu { gate_proj: SwitchLinear(SwitchKind::Quant(g)), up_proj: SwitchLinear(SwitchKind::Quant(u)), down_proj: SwitchLinear(SwitchKind::Quant(d)) } = &glu else {
            unreachable!("quantized experts")
        };
        let got = SwitchGlu::forward_gathered((u, g, d), &x, &idx, &|up, gate| Ok(mlx::fast::swiglu(gate, up)?)).unwrap();
        assert_eq!(got.shape(), vec![1, 3, 2, 64]);
        assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }
}

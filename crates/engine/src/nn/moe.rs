//! Mixture-of-experts layers as mlx-lm's model files build them: the routers ([`Gate`], [`Routing`]),
//! the dense and shared experts' [`GluMlp`], and the feed-forward block [`Ffn`] around the routed
//! experts of [`super::switch`] (`switch_layers.py`), whose items are re-exported here.
use super::quant::QuantConfig;
use super::Linear;
use crate::error::{EngineError, Result};
use crate::shard::ShardMode;
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::{Array, Dtype};

pub use super::switch::{stack_experts, stack_experts_as, SwitchGlu, SwitchLinear};

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

/// Whether routers take [`mlx::fast::moe_route`]'s kernel where their routing suits it (on a CUDA
/// GPU; `MLX_GEN_ROUTE_KERNEL=0` keeps MLX's operations).
fn route_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_GEN_ROUTE_KERNEL").map_or(true, |v| v != "0"))
}

impl Routing {
    /// The chosen experts (..., k) and their weights for router logits `gates` (..., experts), as
    /// mlx-lm's gates compute them after the projection; `bias`: DeepSeek-V3's
    /// `e_score_correction_bias`. With `kernel`, a softmax routing without groups, bias or float32
    /// scores (qwen3_moe, qwen2_moe, mixtral, deepseek_v2's greedy one) runs as one CUDA kernel
    /// ([`mlx::fast::moe_route`]) where the device has it: one kernel a layer instead of three to
    /// six, rounding as MLX's do.
    pub fn choose(&self, gates: &Array, bias: Option<&Array>, kernel: bool) -> Result<(Array, Array)> {
        let plain = bias.is_none() && !self.float32 && self.groups.is_none() && self.normalize_eps.is_none();
        let suits = plain && self.scoring == Scoring::Softmax && !(self.score_after_select && (self.normalize || self.scaling.is_some()));
        if kernel && suits {
            let scale = self.scaling.unwrap_or(1.0) as f32;
            if let Some(chosen) = mlx::fast::moe_route(gates, self.top_k, self.score_after_select, self.select_from_top, self.normalize, scale)? {
                return Ok(chosen);
            }
        }
        let gates = if self.float32 { gates.astype(Dtype::F32)? } else { gates.clone() };
        if self.score_after_select {
            let inds = self.select(&gates)?;
            let scores = gates.take_along_axis(&inds, -1)?.softmax(&[-1], true)?;
            return Ok((inds, scores));
        }
        let scores = match self.scoring {
            Scoring::Softmax => gates.softmax(&[-1], !self.float32)?,
            Scoring::Sigmoid => gates.sigmoid()?,
        };
        let mut choice = match bias {
            Some(b) => scores.add(b)?,
            None => scores.clone(),
        };
        if let Some((n_group, topk_group, rating)) = self.groups {
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
        let inds = self.select(&choice)?;
        let mut scores = scores.take_along_axis(&inds, -1)?;
        if self.normalize {
            let sum = scores.sum(&[-1], true)?;
            let sum = match self.normalize_eps {
                Some(eps) => sum.add_scalar(eps)?,
                None => sum,
            };
            scores = scores.div(&sum)?;
        }
        if let Some(f) = self.scaling {
            scores = scores.mul_scalar(f)?;
        }
        Ok((inds, scores))
    }
}

impl Router for Gate {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = self.proj.forward(x)?; // (B, L, experts)
        self.routing.choose(&gates, self.correction_bias.as_ref(), route_kernel())
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
}

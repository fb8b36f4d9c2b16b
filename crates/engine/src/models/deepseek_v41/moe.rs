//! deepseek_v41's MoE block: a float32 router (`sqrtsoftplus`, sigmoid or softmax scores with a
//! correction bias), clamped-SwiGLU routed experts and a shared expert, summed over the tensor
//! parallel group once at the end.
use super::Config;
use crate::error::Result;
use crate::nn::moe::SwitchGlu;
use crate::nn::{Linear, QuantConfig};
use crate::shard::ShardMode;
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::{fast, Array, Dtype};

/// `DeepseekV41SwiGLU`: in float32, the gate clamped from above and the up part both ways.
fn clamped_swiglu(up: &Array, gate: &Array, limit: f64) -> Result<Array> {
    let (mut gate, mut up) = (gate.astype(Dtype::F32)?, up.astype(Dtype::F32)?);
    if limit > 0.0 {
        gate = gate.minimum_scalar(limit)?;
        up = up.maximum_scalar(-limit)?.minimum_scalar(limit)?;
    }
    Ok(fast::swiglu(&gate, &up)?)
}

/// The MoE block: float32 router, routed experts and the shared one.
#[derive(Clone)]
pub(super) struct Moe {
    gate_weight: Array, // (experts, hidden) f32
    bias: Array,        // (experts,) f32
    switch_mlp: SwitchGlu,
    shared: [Linear; 3], // gate, up, down
    /// Tensor parallel: the group the experts' outputs are summed over.
    reduce: Option<Group>,
    top_k: i32,
    scoring: String,
    gate_temp: f64,
    norm_topk_prob: bool,
    route_scale: f64,
    limit: f64,
}

impl Moe {
    pub(super) fn load(vb: &Vb<'_>, c: &Config, q: &QuantConfig) -> Result<Moe> {
        let (d, h, e) = (c.hidden_size, c.moe_intermediate_size, c.n_routed_experts);
        let s = vb.pp("shared_experts");
        Ok(Moe {
            gate_weight: vb.pp("gate").get("weight", &[e, d])?,
            bias: vb.pp("gate").get("e_score_correction_bias", &[e])?,
            switch_mlp: SwitchGlu::load(&vb.pp("experts").pp("switch_mlp"), d, h, e, q)?,
            shared: [
                Linear::load(&s.pp("gate_proj"), d, h, false, q)?,
                Linear::load(&s.pp("up_proj"), d, h, false, q)?,
                Linear::load(&s.pp("down_proj"), h, d, false, q)?,
            ],
            reduce: None,
            top_k: c.num_experts_per_tok,
            scoring: c.scoring_func.clone(),
            gate_temp: c.gate_temp,
            norm_topk_prob: c.norm_topk_prob,
            route_scale: c.routed_scaling_factor,
            limit: c.swiglu_limit,
        })
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.gate_weight, &self.bias];
        v.extend(self.switch_mlp.arrays());
        v.extend(self.shared.iter().flat_map(|l| l.arrays()));
        v
    }

    /// This rank's block of every routed and the shared expert's hidden units, summed over `group`
    /// once at the end (mlx-lm's `shard_inplace` and `sharding_group`); the router whole.
    pub(super) fn shard(&self, group: &Group) -> Result<Moe> {
        let [g, u, d] = &self.shared;
        Ok(Moe {
            switch_mlp: self.switch_mlp.shard(group)?,
            shared: [
                g.shard(ShardMode::AllToSharded, &[g.out_dims()], group)?,
                u.shard(ShardMode::AllToSharded, &[u.out_dims()], group)?,
                d.shard_inplace(ShardMode::ShardedToAll, &[], group)?,
            ],
            reduce: Some(group.clone()),
            ..self.clone()
        })
    }

    /// x (B, L, D) -> (B, L, D).
    pub(super) fn forward(&self, x: &Array) -> Result<Array> {
        let flat = x.reshape(&[-1, x.dim(-1)])?; // (N, D)
        // Router
        let logits = flat.astype(Dtype::F32)?.matmul(&self.gate_weight.astype(Dtype::F32)?.t()?)?.div_scalar(self.gate_temp)?;
        let scores = match self.scoring.as_str() {
            "sigmoid" => logits.sigmoid()?,
            "softmax" => logits.softmax(&[-1], false)?,
            _ => logits.logaddexp_scalar(0.0)?.sqrt()?,
        };
        let k = self.top_k;
        let chosen = scores.add(&self.bias)?.neg()?.argpartition(k - 1, -1)?.slice_axis(-1, 0, k)?;
        let mut weights = scores.take_along_axis(&chosen, -1)?;
        if self.norm_topk_prob && k > 1 {
            weights = weights.div(&weights.sum(&[-1], true)?.add_scalar(1e-20)?)?;
        }
        let weights = weights.mul_scalar(self.route_scale)?;
        // Experts
        let routed = self.switch_mlp.forward_with(&flat, &chosen, |up, gate| Ok(clamped_swiglu(up, gate, self.limit)?.astype(up.dtype())?))?;
        let routed = routed.astype(Dtype::F32)?.mul(&weights.expand_dims(&[-1])?.astype(Dtype::F32)?)?.sum(&[1], false)?;
        // SharedMLP
        let [g, u, dn] = &self.shared;
        let shared = dn.forward(&clamped_swiglu(&u.forward(&flat)?, &g.forward(&flat)?, self.limit)?.astype(flat.dtype())?)?;
        let out = routed.add(&shared.astype(Dtype::F32)?)?;
        let out = match &self.reduce {
            Some(g) => g.all_sum(&out)?,
            None => out,
        };
        Ok(out.reshape(&x.shape())?.astype(x.dtype())?)
    }
}

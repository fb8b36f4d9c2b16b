//! The routed experts as mlx-lm's `switch_layers.py`: `SwitchLinear` (every expert's matrix stacked
//! into one tensor, run through MLX's gathered (quantized) matmul so only the chosen experts'
//! weights are read) and `SwitchGLU`, with the few-token kernel path and the grouped prompt path;
//! and the `sanitize` stacking of per-expert checkpoint tensors into that layout.
use super::gate_up::{GateUp, Projection};
use super::linear::Weight;
use super::quant::{QuantConfig, Quantized};
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

/// `SwitchLinear` / `QuantizedSwitchLinear` without bias: one (out, in) matrix per expert, the
/// weight (experts, out, in).
#[derive(Clone)]
pub struct SwitchLinear(Weight);

impl SwitchLinear {
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, experts: i32, q: &QuantConfig) -> Result<SwitchLinear> {
        Ok(SwitchLinear(match q.layer(vb, in_dims)? {
            Some(spec) => Weight::Quant(Quantized::load_stacked(vb, &[experts], out_dims, in_dims, spec)?),
            None => Weight::Float(vb.get("weight", &[experts, out_dims, in_dims])?),
        }))
    }

    /// One layer computing `parts` side by side (each expert's outputs concatenated: axis -2 of
    /// the stack), when they are stored alike (all float, or all quantized with the same bits and
    /// group size); evaluated at once so the separate weights can be freed. Each output element is
    /// the same dot product as before (as [`super::Linear::fuse`]).
    fn fuse(parts: &[&SwitchLinear]) -> Result<Option<SwitchLinear>> {
        let Some(w) = Weight::concat(&parts.iter().map(|p| &p.0).collect::<Vec<_>>())? else {
            return Ok(None);
        };
        let fused = SwitchLinear(w);
        mlx::eval(&fused.arrays())?;
        Ok(Some(fused))
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.0.arrays()
    }

    /// x (n, in) through expert `e` alone -> (n, out): a plain (quantized) product over that
    /// expert's slice of the stack, which takes the device's fastest product for n rows.
    fn forward_expert(&self, x: &Array, e: i32) -> Result<Array> {
        let one = |a: &Array| -> Result<Array> { Ok(a.slice_axis(0, e, e + 1)?.squeeze(&[0])?) };
        match &self.0 {
            Weight::Float(w) => Ok(x.matmul(&one(w)?.t()?)?),
            Weight::Quant(q) => q.map(one)?.matmul_t(x),
        }
    }

    /// The number of experts stacked.
    fn experts(&self) -> i32 {
        match &self.0 {
            Weight::Float(w) => w.dim(0),
            Weight::Quant(q) => q.weight.dim(0),
        }
    }

    /// The number of outputs of each expert.
    fn out_dims(&self) -> i32 {
        match &self.0 {
            Weight::Float(w) => w.dim(-2),
            Weight::Quant(q) => q.weight.dim(-2),
        }
    }

    /// This rank's block of every expert (mlx-lm's `shard_inplace`): its output rows (axis -2) for
    /// all-to-sharded, each of `segments` (the output sizes of the layers fused in this one, one
    /// entry when not fused) split evenly; its input columns (axis -1) for sharded-to-all, where
    /// `segments` is unused. No sum over the group here.
    pub fn shard(&self, mode: ShardMode, segments: &[i32], group: &Group) -> Result<SwitchLinear> {
        let (rank, size) = shard::place(group);
        self.shard_of(mode, segments, rank, size)
    }

    /// [`SwitchLinear::shard`] for rank `rank` of `size`.
    fn shard_of(&self, mode: ShardMode, segments: &[i32], rank: i32, size: i32) -> Result<SwitchLinear> {
        let part = |a: &Array| match mode {
            ShardMode::AllToSharded => shard::rows_at(a, -2, segments, rank, size),
            ShardMode::ShardedToAll => shard::block(a, -1, rank, size),
        };
        Ok(SwitchLinear(self.0.map(part)?))
    }

    /// This rank's block of the experts themselves (axis 0: mlx-lm's `shard_inplace` with the
    /// segments on axis 0), each kept whole.
    pub fn shard_experts(&self, group: &Group) -> Result<SwitchLinear> {
        let part = |a: &Array| shard::block(a, 0, group.rank(), group.size());
        Ok(SwitchLinear(self.0.map(part)?))
    }

    /// x (..., 1, in) with expert `indices` -> (..., 1, out).
    pub fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(match &self.0 {
            Weight::Float(w) => {
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
            Weight::Quant(q) => {
                ops::gather_qmm(x, &q.weight, &q.scales, q.biases.as_ref(), Some(indices), true, q.spec, sorted)?
            }
        })
    }
}

impl Projection for SwitchLinear {
    fn fuse(parts: &[&Self]) -> Result<Option<Self>> {
        SwitchLinear::fuse(parts)
    }
    fn arrays(&self) -> Vec<&Array> {
        SwitchLinear::arrays(self)
    }
    fn out_dims(&self) -> i32 {
        SwitchLinear::out_dims(self)
    }
    fn shard(&self, mode: ShardMode, segments: &[i32], group: &Group) -> Result<Self> {
        SwitchLinear::shard(self, mode, segments, group)
    }
}

/// `SwitchGLU` with the default `SwiGLU` activation and no biases.
#[derive(Clone)]
pub struct SwitchGlu {
    gate_up: GateUp<SwitchLinear>,
    down_proj: SwitchLinear,
}

impl SwitchGlu {
    /// With `nn::fused_projections()` on, gate_proj and up_proj stacked into one (experts,
    /// 2 hidden, dims) layer where they are stored alike, so each path runs one product for both.
    pub fn load(vb: &Vb<'_>, dims: i32, hidden: i32, experts: i32, q: &QuantConfig) -> Result<SwitchGlu> {
        let gate = SwitchLinear::load(&vb.pp("gate_proj"), dims, hidden, experts, q)?;
        let up = SwitchLinear::load(&vb.pp("up_proj"), dims, hidden, experts, q)?;
        Ok(SwitchGlu {
            gate_up: GateUp::new(gate, up, hidden)?,
            down_proj: SwitchLinear::load(&vb.pp("down_proj"), hidden, dims, experts, q)?,
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.gate_up.arrays();
        v.extend(self.down_proj.arrays());
        v
    }

    /// This rank's block of every expert's hidden units; the caller sums the outputs over `group`.
    pub fn shard(&self, group: &Group) -> Result<SwitchGlu> {
        let gate_up = self.gate_up.shard(group, "the experts' hidden size")?;
        Ok(SwitchGlu { gate_up, down_proj: self.down_proj.shard(ShardMode::ShardedToAll, &[], group)? })
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
            if let Some((gate_up, down)) = self.gathered_experts() {
                return Self::forward_gathered((&gate_up, down), x, indices, &act);
            }
        }
        let (x, idx, inv_order) = if do_sort {
            let (xs, sorted, inv_order) = gather_sort(x, indices)?;
            (xs.expand_dims(&[-2])?, sorted, Some(inv_order)) // (N, 1, dims)
        } else {
            (x.expand_dims(&[-2, -3])?, indices.clone(), None) // (B, L, 1, 1, dims)
        };
        let (x_up, x_gate) = self.gate_up.up_gate(|p| p.forward(&x, &idx, do_sort))?;
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
    /// ([`SwitchGlu::forward_grouped`]), for a chunk of 64+ positions with 16+ slots an expert on
    /// average: by default on a CUDA GPU, where MLX 0.32.4's gathered product of a sorted prompt is
    /// slow (measured on an H100, BENCHMARKS.md 2026-12-07d: Mixtral-8x7B's 512-token prompt at 2,622
    /// against 209 tok/s, Qwen3-30B-A3B's prefill 2.55x mlx-lm's); `MLX_GEN_MOE_GROUPED=1` on every
    /// device (the CPU and Metal keep MLX's product by default), `=0` never.
    fn grouped_pays(&self, indices: &Array) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| match std::env::var("MLX_GEN_MOE_GROUPED").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => mlx::fast::qmm_rows_available(),
        });
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
            let (up, gate) = self.gate_up.up_gate(|p| p.forward_expert(&xe, e))?;
            let h = act(&up, &gate)?; // (n_e, hidden)
            outs.push(self.down_proj.forward_expert(&h, e)?); // (n_e, dims)
            start = end;
        }
        let y = ops::concatenate(&outs.iter().collect::<Vec<_>>(), 0)?.take(&inv_order, 0)?; // (N, dims)
        let mut shape = indices.shape();
        shape.push(y.dim(-1));
        Ok(y.reshape(&shape)?) // (B, L, k, dims)
    }

    /// The gate/up (fused or not) and down experts where all of them take
    /// [`mlx::fast::gather_qmm_rows`]'s kernel ([`Quantized::gathered_rows_pay`]).
    fn gathered_experts(&self) -> Option<(GateUp<&Quantized>, &Quantized)> {
        fn kernel(s: &SwitchLinear) -> Option<&Quantized> {
            match &s.0 {
                Weight::Quant(q) if q.gathered_rows_pay() => Some(q),
                _ => None,
            }
        }
        Some((self.gate_up.try_map(kernel)?, kernel(&self.down_proj)?))
    }

    /// [`SwitchGlu::forward_with`] for a few tokens through [`mlx::fast::gather_qmm_rows`]: one
    /// kernel a projection (the fused gate/up counting as one), each slot (token, chosen expert)
    /// reading only its expert's weight.
    fn forward_gathered(
        (gate_up, down): (&GateUp<&Quantized>, &Quantized),
        x: &Array,
        indices: &Array,
        act: &impl Fn(&Array, &Array) -> Result<Array>,
    ) -> Result<Array> {
        let k = indices.dim(-1);
        let t = (indices.size() / k.max(1) as usize) as i32;
        let x2 = x.reshape(&[t, x.dim(-1)])?; // (T, dims)
        let idx = indices.reshape(&[t, k])?.astype(Dtype::U32)?; // (T, k)
        let rows = |q: &Quantized, x: &Array| mlx::fast::gather_qmm_rows(x, &q.weight, &q.scales, q.biases.as_ref(), &idx, q.spec);
        let (up, gate) = gate_up.up_gate(|q| Ok(rows(q, &x2)?))?;
        let h = act(&up, &gate)?; // (T, k, hidden)
        let y = rows(down, &h.reshape(&[t * k, h.dim(-1)])?)?; // (T, k, dims)
        let mut shape = indices.shape();
        shape.push(y.dim(-1));
        Ok(y.reshape(&shape)?) // (B, L, k, dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A SwitchGlu of 4 experts (dims 64, hidden 32), separate projections.
    fn glu(gate_proj: SwitchLinear, up_proj: SwitchLinear, down_proj: SwitchLinear) -> SwitchGlu {
        SwitchGlu { gate_up: GateUp::Separate { gate: gate_proj, up: up_proj }, down_proj }
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
            SwitchLinear(Weight::Quant(Quantized { weight, scales, biases, spec: q }))
        };
        let act = |up: &Array, gate: &Array| Ok(mlx::fast::swiglu(gate, up)?);
        for quantized in [false, true] {
            let make = |out, inp, salt| if quantized { quant(float(out, inp, salt)) } else { SwitchLinear(Weight::Float(float(out, inp, salt))) };
            let glu = glu(make(32, 64, 1), make(32, 64, 2), make(64, 32, 3));
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
            Quantized { weight, scales, biases, spec: q }
        };
        let (g, u, d) = (expert(32, 64, 1), expert(32, 64, 2), expert(64, 32, 3));
        let switch = |q: &Quantized| SwitchLinear(Weight::Quant(q.clone()));
        let glu = glu(switch(&g), switch(&u), switch(&d));
        let x = Array::from_slice(&(0..192).map(|i| ((i % 17) as f32 - 8.0) / 16.0).collect::<Vec<_>>(), &[1, 3, 64]).unwrap();
        let idx = Array::from_slice(&[0u32, 3, 2, 1, 3, 2], &[1, 3, 2]).unwrap();
        let want = glu.forward(&x, &idx).unwrap();
        let act = |up: &Array, gate: &Array| Ok(mlx::fast::swiglu(gate, up)?);
        let got = SwitchGlu::forward_gathered((&GateUp::Separate { gate: &g, up: &u }, &d), &x, &idx, &act).unwrap();
        assert_eq!(got.shape(), vec![1, 3, 2, 64]);
        assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }

    #[test]
    fn fused_gate_up_shards_as_the_separate_projections() {
        // Each rank's block of the fused (4, 2 x 32, 64) layer is its block of gate, then its block
        // of up, for every array of a 4-bit layer and of a float one.
        let map = switch_weights(true);
        let q = QuantConfig { default: Some(mlx::ops::QuantSpec::affine(32, 4)), ..QuantConfig::default() };
        let w = Weights::from_map(map);
        let vb = w.view("switch_mlp");
        let gate = SwitchLinear::load(&vb.pp("gate_proj"), 64, 32, 4, &q).unwrap();
        let up = SwitchLinear::load(&vb.pp("up_proj"), 64, 32, 4, &q).unwrap();
        let float = |s: &SwitchLinear| match &s.0 {
            Weight::Quant(q) => SwitchLinear(Weight::Float(mlx::ops::dequantize(&q.weight, &q.scales, q.biases.as_ref(), q.spec).unwrap())),
            Weight::Float(_) => unreachable!("quantized"),
        };
        let bits = |a: &Array| match a.dtype() {
            Dtype::U32 => a.to_vec::<u32>().unwrap(),
            _ => a.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect(),
        };
        for (gate, up) in [(gate.clone(), up.clone()), (float(&gate), float(&up))] {
            let fused = SwitchLinear::fuse(&[&gate, &up]).unwrap().expect("alike");
            for rank in 0..2 {
                let part = |s: &SwitchLinear, segments: &[i32]| s.shard_of(ShardMode::AllToSharded, segments, rank, 2).unwrap();
                let (f, g, u) = (part(&fused, &[32, 32]), part(&gate, &[32]), part(&up, &[32]));
                for (a, (b, c)) in f.arrays().iter().zip(g.arrays().iter().zip(u.arrays())) {
                    assert_eq!(a.shape()[1], 32);
                    let want = ops::concatenate(&[b, c], -2).unwrap();
                    assert_eq!(a.shape(), want.shape());
                    assert_eq!(bits(a), bits(&want), "rank {rank}");
                }
            }
        }
    }

    /// The checkpoint tensors of a SwitchGlu of 4 experts (dims 64, hidden 32) under `switch_mlp`,
    /// 4-bit or float32.
    fn switch_weights(quantized: bool) -> HashMap<String, Array> {
        let q = mlx::ops::QuantSpec::affine(32, 4);
        let mut map = HashMap::new();
        for (name, out, inp) in [("gate_proj", 32, 64), ("up_proj", 32, 64), ("down_proj", 64, 32)] {
            let w = mlx::random::uniform(&[4, out, inp], Dtype::F32).unwrap().add_scalar(-0.5).unwrap();
            if !quantized {
                map.insert(format!("switch_mlp.{name}.weight"), w);
                continue;
            }
            let (weight, scales, biases) = mlx::ops::quantize(&w, q).unwrap();
            map.insert(format!("switch_mlp.{name}.weight"), weight);
            map.insert(format!("switch_mlp.{name}.scales"), scales);
            map.insert(format!("switch_mlp.{name}.biases"), biases.expect("affine biases"));
        }
        map
    }

    #[test]
    fn fused_gate_up_equals_the_separate_projections() {
        // The same checkpoint loaded with the gate/up projections fused and separate: every path
        // (the unsorted and the sorted gathered product, the grouped prompt path and the few-token
        // kernel path) gives the same values bit for bit. The global switch is on only while the
        // fused layer loads.
        let act = |up: &Array, gate: &Array| Ok(mlx::fast::swiglu(gate, up)?);
        for quantized in [true, false] {
            let map = switch_weights(quantized);
            mlx::eval(&map.values().collect::<Vec<_>>()).unwrap();
            let q = QuantConfig { default: quantized.then_some(mlx::ops::QuantSpec::affine(32, 4)), ..QuantConfig::default() };
            let load = |fuse: bool| {
                let w = Weights::from_map(map.clone());
                crate::nn::set_fused_projections(fuse);
                let glu = SwitchGlu::load(&w.view("switch_mlp"), 64, 32, 4, &q);
                crate::nn::set_fused_projections(false);
                w.finish().unwrap();
                glu.unwrap()
            };
            let (fused, separate) = (load(true), load(false));
            assert!(matches!(fused.gate_up, GateUp::Fused(_, 32)), "quantized {quantized}: not fused");
            assert!(matches!(separate.gate_up, GateUp::Separate { .. }));
            assert_eq!(fused.arrays().len() + if quantized { 3 } else { 1 }, separate.arrays().len());
            for t in [3, 40] {
                // 3 tokens x 2 experts: unsorted; 40 x 2 = 80 slots: sorted by expert.
                let x = mlx::random::uniform(&[1, t, 64], Dtype::F32).unwrap();
                let picks: Vec<u32> = (0..t * 2).map(|i| ((i * 7 + i / 3) % 4) as u32).collect();
                let idx = Array::from_slice(&picks, &[1, t, 2]).unwrap();
                let mut pairs = vec![(fused.forward(&x, &idx).unwrap(), separate.forward(&x, &idx).unwrap())];
                if t == 40 {
                    pairs.push((fused.forward_grouped(&x, &idx, &act).unwrap(), separate.forward_grouped(&x, &idx, &act).unwrap()));
                }
                if quantized && t == 3 {
                    // The kernel path's experts, taken whether or not the kernel runs here.
                    fn quant(s: &SwitchLinear) -> Option<&Quantized> {
                        match &s.0 {
                            Weight::Quant(q) => Some(q),
                            Weight::Float(_) => None,
                        }
                    }
                    fn parts(g: &SwitchGlu) -> (GateUp<&Quantized>, &Quantized) {
                        (g.gate_up.try_map(quant).expect("quantized"), quant(&g.down_proj).expect("quantized"))
                    }
                    let ((fg, fd), (sg, sd)) = (parts(&fused), parts(&separate));
                    pairs.push((
                        SwitchGlu::forward_gathered((&fg, fd), &x, &idx, &act).unwrap(),
                        SwitchGlu::forward_gathered((&sg, sd), &x, &idx, &act).unwrap(),
                    ));
                }
                for (i, (a, b)) in pairs.iter().enumerate() {
                    assert_eq!(a.shape(), vec![1, t, 2, 64]);
                    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
                    let worst = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    assert!(worst == 0.0 && a == b, "quantized {quantized}, {t} tokens, path {i}: differs by {worst}");
                }
            }
        }
    }
}

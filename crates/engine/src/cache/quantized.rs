//! mlx-lm's `QuantizedKVCache` (keys and values stored as `mx.quantize` triples, grown in steps
//! of 256) and `quantized_scaled_dot_product_attention` (models/base.py) that attends over them.
use super::{KvCache, QuantTriple, StateNode};
use crate::error::{EngineError, Result};
use mlx::fast::Mask;
use mlx::ops::{self, QuantSpec};
use mlx::{Array, Dtype};

const STEP: i32 = 256;

pub struct QuantizedCache {
    keys: Option<QuantTriple>,
    values: Option<QuantTriple>,
    offset: i32,
    spec: QuantSpec,
}

fn quantize(x: &Array, spec: QuantSpec) -> Result<QuantTriple> {
    let (w, s, b) = ops::quantize_affine(x, spec)?;
    Ok([w, s, b])
}

impl QuantizedCache {
    pub fn new(spec: QuantSpec) -> Self {
        QuantizedCache { keys: None, values: None, offset: 0, spec }
    }

    /// `KVCache.to_quantized`: the whole buffers quantized, the offset kept.
    pub fn from_growing(keys: Option<&Array>, values: Option<&Array>, offset: i32, spec: QuantSpec) -> Result<Self> {
        let mut c = QuantizedCache::new(spec);
        c.offset = offset;
        if let (Some(k), Some(v)) = (keys, values) {
            c.keys = Some(quantize(k, spec)?);
            c.values = Some(quantize(v, spec)?);
        }
        Ok(c)
    }

    /// From a saved `QuantizedKVCache` state.
    pub fn from_state(keys: Option<QuantTriple>, values: Option<QuantTriple>, offset: i32, spec: QuantSpec) -> Result<Self> {
        if keys.is_some() != values.is_some() {
            return Err(EngineError::Invalid("inconsistent QuantizedKVCache state".into()));
        }
        Ok(QuantizedCache { keys, values, offset, spec })
    }

    fn grow(&mut self, like: &Array, b: i32, heads: i32, new_len: i32, k_dim: i32, v_dim: i32) -> Result<()> {
        let prev = self.offset;
        let el_per_int = 32 / self.spec.bits;
        let new_steps = (STEP + new_len - 1) / STEP * STEP;
        let (g, dt) = (self.spec.group_size, like.dtype());
        let init = |dim: i32| -> Result<QuantTriple> {
            Ok([
                ops::zeros(&[b, heads, new_steps, dim / el_per_int], Dtype::U32)?,
                ops::zeros(&[b, heads, new_steps, dim / g], dt)?,
                ops::zeros(&[b, heads, new_steps, dim / g], dt)?,
            ])
        };
        let expand = |t: QuantTriple| -> Result<QuantTriple> {
            let one = |x: &Array| -> Result<Array> {
                let x = if prev % STEP != 0 { x.slice_axis(2, 0, prev)? } else { x.clone() };
                let z = ops::zeros(&[b, heads, new_steps, x.dim(3)], x.dtype())?;
                Ok(ops::concatenate(&[&x, &z], 2)?)
            };
            Ok([one(&t[0])?, one(&t[1])?, one(&t[2])?])
        };
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                self.keys = Some(expand(k)?);
                self.values = Some(expand(v)?);
            }
            _ => {
                self.keys = Some(init(k_dim)?);
                self.values = Some(init(v_dim)?);
            }
        }
        Ok(())
    }

    fn fetch(&self) -> Result<(QuantTriple, QuantTriple)> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Err(EngineError::Invalid("the quantized cache is empty".into()));
        };
        if self.offset == k[0].dim(2) {
            return Ok((k.clone(), v.clone()));
        }
        let cut = |t: &QuantTriple| -> Result<QuantTriple> {
            Ok([t[0].slice_axis(2, 0, self.offset)?, t[1].slice_axis(2, 0, self.offset)?, t[2].slice_axis(2, 0, self.offset)?])
        };
        Ok((cut(k)?, cut(v)?))
    }
}

impl KvCache for QuantizedCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        Err(EngineError::Invalid("a quantized KV cache returns quantized keys: use update_and_fetch_quantized".into()))
    }

    fn quantization(&self) -> Option<QuantSpec> {
        Some(self.spec)
    }

    fn update_and_fetch_quantized(&mut self, keys: &Array, values: &Array) -> Result<(QuantTriple, QuantTriple)> {
        let (b, heads, n, k_dim) = (keys.dim(0), keys.dim(1), keys.dim(2), keys.dim(3));
        let prev = self.offset;
        if self.keys.as_ref().is_none_or(|k| prev + n > k[0].dim(2)) {
            self.grow(keys, b, heads, n, k_dim, values.dim(3))?;
        }
        self.offset += n;
        let qk = quantize(keys, self.spec)?;
        let qv = quantize(values, self.spec)?;
        let write = |dst: &mut QuantTriple, src: &QuantTriple| -> Result<()> {
            for (d, s) in dst.iter_mut().zip(src) {
                let stop = [d.dim(0), d.dim(1), self.offset, d.dim(3)];
                *d = d.slice_update(s, &[0, 0, prev, 0], &stop)?;
            }
            Ok(())
        };
        if let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) {
            write(k, &qk)?;
            write(v, &qv)?;
        }
        self.fetch()
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        let n = n.min(self.offset).max(0);
        self.offset -= n;
        Ok(n)
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).flat_map(|t| t.iter().cloned()).collect()
    }

    fn nbytes(&self) -> usize {
        self.state().iter().map(Array::nbytes).sum()
    }

    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let tri = |t: &Option<QuantTriple>| match t {
            Some(t) => StateNode::List(t.iter().cloned().map(StateNode::Array).collect()),
            None => StateNode::None,
        };
        let int = |x: i32| StateNode::Int(i64::from(x));
        Ok((
            "QuantizedKVCache",
            vec![tri(&self.keys), tri(&self.values), int(self.offset), int(self.spec.group_size), int(self.spec.bits)],
        ))
    }
}

/// models/base.py's `quantized_scaled_dot_product_attention`: queries (B, Hq, L, D) over quantized
/// keys/values (B, Hkv, S, ·).
pub fn quantized_sdpa(queries: &Array, keys: &QuantTriple, values: &QuantTriple, scale: f32, mask: Mask<'_>, spec: QuantSpec) -> Result<Array> {
    let (b, n_q_heads, l, d) = (queries.dim(0), queries.dim(1), queries.dim(2), queries.dim(3));
    let n_kv_heads = keys[0].dim(-3);
    let n_repeats = n_q_heads / n_kv_heads;
    let mut q = queries.mul_scalar(f64::from(scale))?;
    let expand = |t: &QuantTriple| -> Result<QuantTriple> {
        Ok([t[0].expand_dims(&[-3])?, t[1].expand_dims(&[-3])?, t[2].expand_dims(&[-3])?])
    };
    let (k, v) = if n_repeats > 1 {
        q = q.reshape(&[b, n_kv_heads, n_repeats, l, d])?;
        (expand(keys)?, expand(values)?)
    } else {
        (keys.clone(), values.clone())
    };
    let mut scores = ops::quantized_matmul(&q, &k[0], &k[1], Some(&k[2]), true, spec)?;
    let causal;
    let mask = match mask {
        Mask::None => None,
        Mask::Causal => {
            let (ql, kl) = (scores.dim(-2), scores.dim(-1));
            let qi = ops::arange(f64::from(kl - ql), f64::from(kl), 1.0, Dtype::I32)?.expand_dims(&[1])?;
            let ki = ops::arange(0.0, f64::from(kl), 1.0, Dtype::I32)?.expand_dims(&[0])?;
            causal = qi.ge(&ki)?;
            Some(&causal)
        }
        Mask::Array(a) => Some(a),
    };
    if let Some(m) = mask {
        let expanded;
        let m = if n_repeats > 1 && m.ndim() > 3 {
            expanded = m.expand_dims(&[-3])?;
            &expanded
        } else {
            m
        };
        scores = if m.dtype() == Dtype::Bool {
            let min = Array::scalar(scores.dtype().finfo_min(), scores.dtype())?;
            ops::where_(m, &scores, &min)?
        } else {
            scores.add(m)?
        };
    }
    let scores = scores.softmax(&[-1], true)?;
    let out = ops::quantized_matmul(&scores, &v[0], &v[1], Some(&v[2]), false, spec)?;
    Ok(if n_repeats > 1 { out.reshape(&[b, n_q_heads, l, d])? } else { out })
}

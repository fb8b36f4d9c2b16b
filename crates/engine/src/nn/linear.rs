//! `nn.Linear` and `nn.QuantizedLinear`: y = x Wᵀ (+ b), W float or affine-quantized.
use super::quant::{QuantConfig, Quantized};
use crate::error::Result;
use crate::weights::Vb;
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
}

impl Linear {
    /// Loads `weight` (and `bias` when `bias`), quantized where the checkpoint has `scales`.
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, bias: bool, q: &QuantConfig) -> Result<Linear> {
        let kind = match q.layer(vb, in_dims)? {
            Some(spec) => Kind::Quant(Quantized::load(vb, out_dims, in_dims, spec)?),
            None => Kind::Float(vb.get("weight", &[out_dims, in_dims])?),
        };
        let bias = if bias { Some(vb.get("bias", &[out_dims])?) } else { None };
        Ok(Linear { kind, bias })
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

    /// x (..., in) -> (..., out)
    pub fn forward(&self, x: &Array) -> Result<Array> {
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

//! `nn.Embedding` and `nn.QuantizedEmbedding`, including `as_linear` for tied output heads.
use super::quant::{QuantConfig, Quantized};
use crate::error::Result;
use checkpoint::Vb;
use mlx::{ops, Array};

#[derive(Clone)]
enum Kind {
    Float(Array), // (vocab, dims)
    Quant(Quantized),
}

#[derive(Clone)]
pub struct Embedding(Kind);

impl Embedding {
    pub fn load(vb: &Vb<'_>, vocab: i32, dims: i32, q: &QuantConfig) -> Result<Embedding> {
        Ok(match q.layer(vb, dims)? {
            Some(spec) => Embedding(Kind::Quant(Quantized::load(vb, vocab, dims, spec)?)),
            None => Embedding(Kind::Float(vb.get("weight", &[vocab, dims])?)),
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            Kind::Float(w) => vec![w],
            Kind::Quant(q) => q.arrays(),
        }
    }

    /// ids (B, L) -> (B, L, dims)
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match &self.0 {
            Kind::Float(w) => w.take(ids, 0)?,
            Kind::Quant(q) => ops::dequantize(
                &q.weight.take(ids, 0)?,
                &q.scales.take(ids, 0)?,
                q.biases.as_ref().map(|b| b.take(ids, 0)).transpose()?.as_ref(),
                q.spec,
            )?,
        })
    }

    /// x (..., dims) -> (..., vocab), the embedding used as the output projection.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        Ok(match &self.0 {
            Kind::Float(w) => x.matmul(&w.t()?)?,
            Kind::Quant(q) => q.matmul_t(x)?,
        })
    }
}

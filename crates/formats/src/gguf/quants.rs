//! ggml tensor types: block sizes, host dequantization exactly as ggml's reference code (floats,
//! Q4_0-Q8_0 and the K-quants Q2_K-Q6_K), and the lossless repacking of Q4_0, Q4_1 and Q8_0 blocks
//! into MLX affine quantization (group size 32).
use super::GgufError;
use half::{bf16, f16};

/// The ggml element types a GGUF may hold (numbered as `enum ggml_type`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl GgmlType {
    pub fn from_code(code: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match code {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (u64, u64) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 | IQ4_NL => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            MXFP4 => (32, 17),
            Q2_K => (256, 84),
            Q3_K | IQ3_S => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            IQ2_XXS | TQ2_0 => (256, 66),
            IQ2_XS => (256, 74),
            IQ3_XXS => (256, 98),
            IQ1_S => (256, 50),
            IQ2_S => (256, 82),
            IQ4_XS => (256, 136),
            IQ1_M => (256, 56),
            TQ1_0 => (256, 54),
        }
    }

    /// Whether [`dequantize`] reads this type (the list is [`SUPPORTED`]).
    pub fn is_supported(self) -> bool {
        SUPPORTED.contains(&self)
    }

    /// An error naming this type and listing the supported ones.
    pub fn unsupported(self) -> GgufError {
        let names: Vec<String> = SUPPORTED.iter().map(|t| format!("{t:?}")).collect();
        GgufError::Unsupported(format!("ggml type {self:?} cannot be converted (supported: {})", names.join(", ")))
    }

    /// Whether [`repack_lossless`] maps this type exactly onto MLX affine quantization.
    pub fn is_lossless(self) -> bool {
        matches!(self, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
    }
}

/// The ggml types [`dequantize`] reads.
pub const SUPPORTED: &[GgmlType] = {
    use GgmlType::*;
    &[F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K]
};

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Dequantizes `data` (whole blocks of `ty`) to float32, as ggml's `dequantize_row_*`.
pub fn dequantize(ty: GgmlType, data: &[u8]) -> Result<Vec<f32>, GgufError> {
    use GgmlType::*;
    let (qk, bs) = ty.block();
    let (qk, bs) = (qk as usize, bs as usize);
    if !data.len().is_multiple_of(bs) {
        return Err(GgufError::Corrupt(format!("{ty:?} data of {} bytes is not whole blocks", data.len())));
    }
    let mut y = Vec::with_capacity(data.len() / bs * qk);
    let blocks = data.chunks_exact(bs);
    match ty {
        F32 => y.extend(data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        F16 => y.extend(data.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        BF16 => y.extend(data.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        Q4_0 => {
            for b in blocks {
                let d = h(b, 0);
                let qs = &b[2..18];
                y.extend(qs.iter().map(|&q| ((q & 0xF) as i32 - 8) as f32 * d));
                y.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
        }
        Q4_1 => {
            for b in blocks {
                let (d, m) = (h(b, 0), h(b, 2));
                let qs = &b[4..20];
                y.extend(qs.iter().map(|&q| (q & 0xF) as f32 * d + m));
                y.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
            }
        }
        Q5_0 | Q5_1 => {
            for b in blocks {
                let (d, m, o) = if ty == Q5_0 { (h(b, 0), 0.0, 2) } else { (h(b, 0), h(b, 2), 4) };
                let qh = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
                let qs = &b[o + 4..o + 20];
                let lo = |j: usize| ((qs[j] & 0xF) as u32 | (((qh >> j) << 4) & 0x10)) as i32;
                let hi = |j: usize| ((qs[j] >> 4) as u32 | ((qh >> (j + 12)) & 0x10)) as i32;
                if ty == Q5_0 {
                    y.extend((0..16).map(|j| (lo(j) - 16) as f32 * d));
                    y.extend((0..16).map(|j| (hi(j) - 16) as f32 * d));
                } else {
                    y.extend((0..16).map(|j| lo(j) as f32 * d + m));
                    y.extend((0..16).map(|j| hi(j) as f32 * d + m));
                }
            }
        }
        Q8_0 => {
            for b in blocks {
                let d = h(b, 0);
                y.extend(b[2..34].iter().map(|&q| (q as i8) as f32 * d));
            }
        }
        Q2_K => {
            // scales[16] (4-bit scale | 4-bit min << 4), qs[64] (2-bit), d, dmin.
            for b in blocks {
                let (d, min) = (h(b, 80), h(b, 82));
                let mut sub = b[0..16].iter();
                for n in 0..2 {
                    let q = &b[16 + n * 32..48 + n * 32];
                    for shift in (0..8).step_by(2) {
                        for half in [&q[..16], &q[16..]] {
                            let sc = sub.next().copied().unwrap_or(0);
                            let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                            y.extend(half.iter().map(|&v| dl * ((v >> shift) & 3) as f32 - ml));
                        }
                    }
                }
            }
        }
        Q3_K => {
            // hmask[32] (high bits, set = no -4), qs[64] (low 2 bits), 12 bytes of 6-bit scales, d.
            for b in blocks {
                let d = h(b, 108);
                let word = |i: usize| u32::from_le_bytes([b[96 + 4 * i], b[97 + 4 * i], b[98 + 4 * i], b[99 + 4 * i]]);
                let (a0, a1, tmp) = (word(0), word(1), word(2));
                let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
                let aux = [
                    (a0 & k2) | ((tmp & k1) << 4),
                    (a1 & k2) | (((tmp >> 2) & k1) << 4),
                    ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                    ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
                ];
                let mut sub = aux.iter().flat_map(|w| w.to_le_bytes());
                let hm = &b[0..32];
                let mut m = 1u8;
                for n in 0..2 {
                    let q = &b[32 + n * 32..64 + n * 32];
                    for shift in (0..8).step_by(2) {
                        for (half, hmh) in [(&q[..16], &hm[..16]), (&q[16..], &hm[16..])] {
                            let dl = d * ((sub.next().unwrap_or(32) as i8) as i32 - 32) as f32;
                            y.extend(half.iter().zip(hmh).map(|(&v, &hb)| {
                                let q = ((v >> shift) & 3) as i32 - if hb & m != 0 { 0 } else { 4 };
                                dl * q as f32
                            }));
                        }
                        m <<= 1;
                    }
                }
            }
        }
        Q4_K | Q5_K => {
            for b in blocks {
                let (d, min) = (h(b, 0), h(b, 2));
                let scales = &b[4..16];
                let (qh, mut ql) = if ty == Q5_K { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
                let (mut u1, mut u2) = (1u8, 2u8);
                for is in (0..8).step_by(2) {
                    let (sc, m) = scale_min_k4(is, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = scale_min_k4(is + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    let high = |l: usize, u: u8| if ty == Q5_K && qh[l] & u != 0 { 16 } else { 0 };
                    y.extend((0..32).map(|l| d1 * ((ql[l] & 0xF) + high(l, u1)) as f32 - m1));
                    y.extend((0..32).map(|l| d2 * ((ql[l] >> 4) + high(l, u2)) as f32 - m2));
                    ql = &ql[32..];
                    u1 <<= 2;
                    u2 <<= 2;
                }
            }
        }
        Q6_K => {
            for b in blocks {
                let d = h(b, 208);
                let mut out = [0f32; 256];
                for n in 0..2 {
                    let ql = &b[n * 64..n * 64 + 64];
                    let qh = &b[128 + n * 32..128 + n * 32 + 32];
                    let sc = &b[192 + n * 8..192 + n * 8 + 8];
                    let y = &mut out[n * 128..n * 128 + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let s = |k: usize| d * (sc[is + k] as i8) as f32;
                        y[l] = s(0) * q1 as f32;
                        y[l + 32] = s(2) * q2 as f32;
                        y[l + 64] = s(4) * q3 as f32;
                        y[l + 96] = s(6) * q4 as f32;
                    }
                }
                y.extend_from_slice(&out);
            }
        }
        other => return Err(other.unsupported()),
    }
    Ok(y)
}

/// MLX affine quantization of one tensor, on the host: packed weight (u32 words), scales and
/// biases (raw float16 bits), group size 32.
pub struct Packed {
    pub weight: Vec<u32>,
    pub scales: Vec<u16>,
    pub biases: Vec<u16>,
    pub bits: i32,
}

/// `v` as float16 if it converts exactly (no rounding, no overflow).
fn exact_f16(v: f32) -> Option<u16> {
    let x = f16::from_f32(v);
    (x.to_f32() == v).then_some(x.to_bits())
}

/// Repacks Q4_0 / Q4_1 / Q8_0 blocks as MLX affine groups of 32 (value = scale * q + bias):
/// Q4_1 scale d, bias m; Q4_0 scale d, bias -8d; Q8_0 q + 128 at 8 bits, bias -128d. Returns `None`
/// when some bias is not exact in float16 (the caller then dequantizes instead).
pub fn repack_lossless(ty: GgmlType, data: &[u8]) -> Option<Packed> {
    let (_, bs) = ty.block();
    let n = data.len() / bs as usize;
    let bits = if ty == GgmlType::Q8_0 { 8 } else { 4 };
    let mut p = Packed {
        weight: Vec::with_capacity(n * bits as usize),
        scales: Vec::with_capacity(n),
        biases: Vec::with_capacity(n),
        bits,
    };
    for b in data.chunks_exact(bs as usize) {
        let d_bits = u16::from_le_bytes([b[0], b[1]]);
        let d = f16::from_bits(d_bits).to_f32();
        let mut q = [0u8; 32];
        let bias = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let qs = if ty == GgmlType::Q4_0 { &b[2..18] } else { &b[4..20] };
                for j in 0..16 {
                    q[j] = qs[j] & 0xF;
                    q[j + 16] = qs[j] >> 4;
                }
                if ty == GgmlType::Q4_0 {
                    exact_f16(-8.0 * d)?
                } else {
                    u16::from_le_bytes([b[2], b[3]])
                }
            }
            GgmlType::Q8_0 => {
                for (dst, &s) in q.iter_mut().zip(&b[2..34]) {
                    *dst = ((s as i8) as i16 + 128) as u8;
                }
                exact_f16(-128.0 * d)?
            }
            _ => return None,
        };
        p.scales.push(d_bits);
        p.biases.push(bias);
        let per_word = (32 / bits) as usize;
        for word in q.chunks_exact(per_word) {
            p.weight.push(word.iter().enumerate().fold(0u32, |acc, (i, &v)| acc | (v as u32) << (i * bits as usize)));
        }
    }
    Some(p)
}

//! Outpainting canvases: the source copied bit-exact into a padded canvas (edge, reflect or constant fill, sides rounded up to a latent alignment), its binary mask and an optional feathered mask.
use crate::{FlowError, Result};

/// The largest canvas side accepted, in pixels.
pub const MAX_SIDE: u32 = 16384;

/// Padding in pixels on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pad {
    pub left: u32,
    pub top: u32,
    pub right: u32,
    pub bottom: u32,
}

impl Pad {
    /// Parses `LEFT,TOP,RIGHT,BOTTOM` (or one number for all four sides).
    pub fn parse(s: &str) -> Result<Pad> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let nums = parts
            .iter()
            .map(|p| {
                if p.starts_with('-') {
                    return Err(FlowError::Invalid(format!("padding cannot be negative, got {p} in {s:?}")));
                }
                let n: u64 = p.parse().map_err(|_| {
                    FlowError::Invalid(format!("padding {p:?} in {s:?} is not a whole number of pixels"))
                })?;
                u32::try_from(n).ok().filter(|&n| n <= MAX_SIDE).ok_or_else(|| {
                    FlowError::Invalid(format!("padding {n} is too large (at most {MAX_SIDE} pixels a side)"))
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        match nums[..] {
            [n] => Ok(Pad { left: n, top: n, right: n, bottom: n }),
            [left, top, right, bottom] => Ok(Pad { left, top, right, bottom }),
            _ => Err(FlowError::Invalid(format!("padding must be LEFT,TOP,RIGHT,BOTTOM (or one number), got {s:?}"))),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Pad::default()
    }
}

/// Grows `a` + `b` padding so that `size + a + b` is a multiple of `align`: the extra goes to the
/// one padded side, or is split evenly (the larger half second) when both or neither are padded.
fn grow(size: u32, a: u32, b: u32, align: u32) -> (u64, u64) {
    let (a, b) = (u64::from(a), u64::from(b));
    let total = u64::from(size) + a + b;
    let extra = total.div_ceil(u64::from(align)) * u64::from(align) - total;
    match (a > 0, b > 0) {
        (true, false) => (a + extra, b),
        (false, true) => (a, b + extra),
        _ => (a + extra / 2, b + extra - extra / 2),
    }
}

/// The padding actually used for a `width`×`height` source: `pad` grown (never shrunk) so both canvas
/// sides are multiples of `align` (≥ 1), with each side at most [`MAX_SIDE`].
pub fn aligned_pad(width: u32, height: u32, pad: Pad, align: u32) -> Result<Pad> {
    if align == 0 || align > 1024 {
        return Err(FlowError::Invalid(format!("alignment must be between 1 and 1024, got {align}")));
    }
    let (left, right) = grow(width, pad.left, pad.right, align);
    let (top, bottom) = grow(height, pad.top, pad.bottom, align);
    let (w, h) = (u64::from(width) + left + right, u64::from(height) + top + bottom);
    if w > u64::from(MAX_SIDE) || h > u64::from(MAX_SIDE) {
        return Err(FlowError::Invalid(format!(
            "the padded canvas would be {w}x{h} pixels, more than the {MAX_SIDE}x{MAX_SIDE} allowed"
        )));
    }
    // Each value is below MAX_SIDE here.
    Ok(Pad { left: left as u32, top: top as u32, right: right as u32, bottom: bottom as u32 })
}

/// How the padding is filled.
#[derive(Clone, Debug, PartialEq)]
pub enum Fill<T> {
    /// Repeat the nearest source pixel (numpy `edge`).
    Edge,
    /// Mirror the source without repeating the edge pixel (numpy `reflect`), repeated as needed.
    Reflect,
    /// One pixel value, one sample per channel.
    Constant(Vec<T>),
}

/// An interleaved image: `width`·`height` pixels of `channels` samples, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Raster<T> {
    pub width: u32,
    pub height: u32,
    pub channels: usize,
    pub data: Vec<T>,
}

/// Source index for canvas coordinate `i` (relative to the source origin) along a side of `n` pixels.
pub fn source_index(i: i64, n: i64, reflect: bool) -> i64 {
    if !reflect || n == 1 {
        return i.clamp(0, n - 1);
    }
    let period = 2 * (n - 1);
    let m = i.rem_euclid(period);
    if m >= n {
        period - m
    } else {
        m
    }
}

/// The canvas: `src` at (`pad.left`, `pad.top`), its pixels copied unchanged, the rest filled by `fill`.
pub fn expand<T: Copy>(src: &Raster<T>, pad: Pad, fill: &Fill<T>) -> Result<Raster<T>> {
    let (w, h, c) = (src.width as usize, src.height as usize, src.channels);
    if w == 0 || h == 0 || c == 0 || src.data.len() != w * h * c {
        return Err(FlowError::Invalid(format!(
            "bad source image: {w}x{h} pixels of {c} channels in {} samples",
            src.data.len()
        )));
    }
    if let Fill::Constant(px) = fill {
        if px.len() != c {
            return Err(FlowError::Invalid(format!("fill colour has {} channels, the image {c}", px.len())));
        }
    }
    let ow = w + (pad.left + pad.right) as usize;
    let oh = h + (pad.top + pad.bottom) as usize;
    let (l, t) = (pad.left as usize, pad.top as usize);
    let reflect = matches!(fill, Fill::Reflect);
    let mut data = Vec::with_capacity(ow * oh * c);
    for y in 0..oh {
        let inside_y = (t..t + h).contains(&y);
        let sy = source_index(y as i64 - t as i64, h as i64, reflect) as usize;
        for x in 0..ow {
            let inside = inside_y && (l..l + w).contains(&x);
            match fill {
                Fill::Constant(px) if !inside => data.extend_from_slice(px),
                _ => {
                    let sx = source_index(x as i64 - l as i64, w as i64, reflect) as usize;
                    let at = (sy * w + sx) * c;
                    data.extend_from_slice(&src.data[at..at + c]);
                }
            }
        }
    }
    Ok(Raster { width: ow as u32, height: oh as u32, channels: c, data })
}

/// The binary mask of a canvas made from a `width`×`height` source with `pad`: 0 over the source,
/// 255 over the padding, nothing else.
pub fn mask(width: u32, height: u32, pad: Pad) -> Raster<u8> {
    soft_mask(width, height, pad, 0)
}

/// The feathered mask: 255 over the padding, and inside the source a linear ramp over `feather`
/// pixels from the padded sides, round(255·(feather + 1 − d)/(feather + 1)) at distance d ≤ feather
/// from the padding, 0 further in. `feather` 0 gives the binary mask.
pub fn soft_mask(width: u32, height: u32, pad: Pad, feather: u32) -> Raster<u8> {
    let (w, h) = (width as usize, height as usize);
    let ow = w + (pad.left + pad.right) as usize;
    let oh = h + (pad.top + pad.bottom) as usize;
    let (l, t) = (pad.left as usize, pad.top as usize);
    let f = u64::from(feather);
    let mut data = vec![255u8; ow * oh];
    for y in 0..h {
        for x in 0..w {
            // Distance (in pixels) to the nearest padding pixel, over the padded sides only.
            let d = [
                (pad.left > 0).then_some(x + 1),
                (pad.right > 0).then_some(w - x),
                (pad.top > 0).then_some(y + 1),
                (pad.bottom > 0).then_some(h - y),
            ]
            .into_iter()
            .flatten()
            .min()
            .map_or(u64::MAX, |d| d as u64);
            // round(255·(f + 1 − d) / (f + 1)), halves up, in integers.
            let v = if d <= f { ((2 * 255 * (f + 1 - d) + f + 1) / (2 * (f + 1))) as u8 } else { 0 };
            data[(t + y) * ow + l + x] = v;
        }
    }
    Raster { width: ow as u32, height: oh as u32, channels: 1, data }
}

/// A `#RRGGBB` colour as the samples of a `channels`-channel 8-bit pixel: luma (Rec. 601,
/// rounded) for grey, RGB, and an opaque alpha where the image has one.
pub fn color_samples(rgb: [u8; 3], channels: usize) -> Vec<u8> {
    let luma = ((299 * u32::from(rgb[0]) + 587 * u32::from(rgb[1]) + 114 * u32::from(rgb[2]) + 500) / 1000) as u8;
    match channels {
        1 => vec![luma],
        2 => vec![luma, 255],
        3 => rgb.to_vec(),
        _ => vec![rgb[0], rgb[1], rgb[2], 255],
    }
}

/// Parses `#RRGGBB` (the `#` optional).
pub fn parse_color(s: &str) -> Result<[u8; 3]> {
    let hex = s.strip_prefix('#').unwrap_or(s);
    let bad = || FlowError::Invalid(format!("colour must be #RRGGBB, got {s:?}"));
    if hex.len() != 6 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let byte = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| bad());
    Ok([byte(0)?, byte(2)?, byte(4)?])
}

//! `mlx-gen outpaint-prep`: the padded outpainting canvas (source pixels bit-exact), its binary mask, and an optional feathered mask, as PNG files.
use anyhow::{bail, Context, Result};
use flow::outpaint::{self, Fill, Pad, Raster};
use image::{DynamicImage, ImageBuffer, ImageFormat, ImageReader};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// The source image (PNG or JPEG).
    #[arg(long)]
    pub image: PathBuf,
    /// Padding in pixels: LEFT,TOP,RIGHT,BOTTOM, or one number for all four sides.
    #[arg(long, allow_hyphen_values = true)]
    pub pad: String,
    /// Where to write the canvas (PNG, same channels and bit depth as the source).
    #[arg(long)]
    pub canvas: PathBuf,
    /// Where to write the binary mask (8-bit grey PNG: 0 over the source, 255 over the padding).
    #[arg(long)]
    pub mask: PathBuf,
    /// How to fill the padding: edge, reflect, or color:#RRGGBB.
    #[arg(long, default_value = "edge")]
    pub fill: String,
    /// Round the canvas sides up to a multiple of this by growing the padding (1 = off; 16 suits SD3/FLUX).
    #[arg(long, default_value_t = 16)]
    pub align: u32,
    /// Feather width in pixels of the soft mask (needs --soft-mask).
    #[arg(long, requires = "soft_mask")]
    pub feather: Option<u32>,
    /// Where to write the feathered mask for blending (8-bit grey PNG; needs --feather).
    #[arg(long, requires = "feather")]
    pub soft_mask: Option<PathBuf>,
}

enum FillArg {
    Edge,
    Reflect,
    Color([u8; 3]),
}

fn parse_fill(s: &str) -> Result<FillArg> {
    match s {
        "edge" => Ok(FillArg::Edge),
        "reflect" => Ok(FillArg::Reflect),
        _ => match s.strip_prefix("color:") {
            Some(c) => Ok(FillArg::Color(outpaint::parse_color(c)?)),
            None => bail!("--fill must be edge, reflect or color:#RRGGBB, got {s:?}"),
        },
    }
}

/// The fill for samples of type T (8-bit colours scaled by `scale`: 1 for 8-bit, 257 for 16-bit).
fn fill_for<T: From<u8> + Copy + std::ops::Mul<Output = T>>(f: &FillArg, channels: usize, scale: T) -> Fill<T> {
    match f {
        FillArg::Edge => Fill::Edge,
        FillArg::Reflect => Fill::Reflect,
        FillArg::Color(rgb) => {
            Fill::Constant(outpaint::color_samples(*rgb, channels).into_iter().map(|v| T::from(v) * scale).collect())
        }
    }
}

fn check_png_path(flag: &str, p: &Path) -> Result<()> {
    match p.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("png") => Ok(()),
        _ => bail!("{flag} {}: the output must be a .png file (lossless)", p.display()),
    }
}

fn save(img: DynamicImage, path: &Path) -> Result<()> {
    img.save_with_format(path, ImageFormat::Png).with_context(|| format!("cannot write {}", path.display()))
}

macro_rules! to_dynamic {
    ($r:expr, $($ch:literal => $px:ident => $var:ident),*) => {
        match $r.channels {
            $($ch => ImageBuffer::<image::$px<_>, _>::from_raw($r.width, $r.height, $r.data).map(DynamicImage::$var),)*
            _ => None,
        }
    };
}

fn to_dynamic8(r: Raster<u8>) -> Option<DynamicImage> {
    to_dynamic!(r, 1 => Luma => ImageLuma8, 2 => LumaA => ImageLumaA8, 3 => Rgb => ImageRgb8, 4 => Rgba => ImageRgba8)
}

fn to_dynamic16(r: Raster<u16>) -> Option<DynamicImage> {
    to_dynamic!(r, 1 => Luma => ImageLuma16, 2 => LumaA => ImageLumaA16, 3 => Rgb => ImageRgb16, 4 => Rgba => ImageRgba16)
}

fn raster<T>(width: u32, height: u32, channels: usize, data: Vec<T>) -> Raster<T> {
    Raster { width, height, channels, data }
}

/// Reads a PNG or JPEG with its own channels and bit depth.
pub fn load(path: &Path) -> Result<DynamicImage> {
    let reader = ImageReader::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let reader = reader.with_guessed_format().with_context(|| format!("cannot read {}", path.display()))?;
    if reader.format().is_none() {
        bail!("{} is not a PNG or JPEG image", path.display());
    }
    reader.decode().with_context(|| format!("{} is not a readable PNG or JPEG image", path.display()))
}

pub fn run(args: &Args) -> Result<()> {
    let pad = Pad::parse(&args.pad).context("--pad")?;
    let fill = parse_fill(&args.fill)?;
    check_png_path("--canvas", &args.canvas)?;
    check_png_path("--mask", &args.mask)?;
    if let Some(p) = &args.soft_mask {
        check_png_path("--soft-mask", p)?;
    }
    let img = load(&args.image)?;
    let (w, h) = (img.width(), img.height());
    let pad = outpaint::aligned_pad(w, h, pad, args.align)?;
    let canvas = match img {
        DynamicImage::ImageLuma8(b) => expand8(raster(w, h, 1, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageLumaA8(b) => expand8(raster(w, h, 2, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageRgb8(b) => expand8(raster(w, h, 3, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageRgba8(b) => expand8(raster(w, h, 4, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageLuma16(b) => expand16(raster(w, h, 1, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageLumaA16(b) => expand16(raster(w, h, 2, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageRgb16(b) => expand16(raster(w, h, 3, b.into_raw()), pad, &fill)?,
        DynamicImage::ImageRgba16(b) => expand16(raster(w, h, 4, b.into_raw()), pad, &fill)?,
        other => bail!("{}: unsupported pixel format {:?}", args.image.display(), other.color()),
    };
    let (cw, ch) = (canvas.width(), canvas.height());
    save(canvas, &args.canvas)?;
    let mask = to_dynamic8(outpaint::mask(w, h, pad)).context("mask buffer")?;
    save(mask, &args.mask)?;
    if let (Some(feather), Some(path)) = (args.feather, &args.soft_mask) {
        let soft = to_dynamic8(outpaint::soft_mask(w, h, pad, feather)).context("soft mask buffer")?;
        save(soft, path)?;
    }
    println!(
        "canvas {cw}x{ch}: source {w}x{h} at ({}, {}), padding {},{},{},{} -> {}, mask {}",
        pad.left,
        pad.top,
        pad.left,
        pad.top,
        pad.right,
        pad.bottom,
        args.canvas.display(),
        args.mask.display()
    );
    Ok(())
}

fn expand8(src: Raster<u8>, pad: Pad, fill: &FillArg) -> Result<DynamicImage> {
    let out = outpaint::expand(&src, pad, &fill_for(fill, src.channels, 1u8))?;
    to_dynamic8(out).context("canvas buffer")
}

fn expand16(src: Raster<u16>, pad: Pad, fill: &FillArg) -> Result<DynamicImage> {
    let out = outpaint::expand(&src, pad, &fill_for(fill, src.channels, 257u16))?;
    to_dynamic16(out).context("canvas buffer")
}

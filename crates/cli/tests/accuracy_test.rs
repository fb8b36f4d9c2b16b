//! Flow-matching and outpainting accuracy: the invariant table (σ(0) = 1, σ(N) = 0, strict decay, Euler drift, pixel conservation, binary mask), numpy test vectors (tests/flow), and the `flow-schedule` / `outpaint-prep` commands.
mod common;

use flow::outpaint::{self, Pad};
use flow::{self, DynamicShift, FlowSchedule, Shift, Spacing};
use image::{DynamicImage, ImageBuffer};
use mlx::{Array, Dtype};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

const STEPS: [usize; 6] = [1, 2, 4, 28, 50, 1000];

/// MLX work of the tests runs one test at a time.
static MLX: Mutex<()> = Mutex::new(());

fn shifts() -> Vec<Shift> {
    let d = DynamicShift::default();
    let mut v: Vec<Shift> = [1.0, 3.0, 0.5, 6.0].into_iter().map(Shift::Static).collect();
    for len in [256, 1024, 4096, 16384] {
        v.push(Shift::Dynamic { mu: d.mu(len).unwrap() });
    }
    v.extend([-1.0, 0.0, 2.0].map(|mu| Shift::Dynamic { mu }));
    v
}

fn all_schedules() -> Vec<(usize, Shift, Spacing, FlowSchedule)> {
    let mut out = Vec::new();
    for steps in STEPS {
        for shift in shifts() {
            for spacing in [Spacing::Diffusers, Spacing::Flux] {
                let s = FlowSchedule::new(steps, shift, spacing)
                    .unwrap_or_else(|e| panic!("{steps} steps, {shift:?}, {spacing:?}: {e}"));
                out.push((steps, shift, spacing, s));
            }
        }
    }
    out
}

#[test]
fn schedule_invariants() {
    for (steps, shift, spacing, s) in all_schedules() {
        let ctx = format!("{steps} steps, {shift:?}, {spacing:?}");
        assert_eq!(s.sigmas.len(), steps + 1, "{ctx}");
        assert_eq!(s.timesteps.len(), steps, "{ctx}");
        assert_eq!(s.sigmas[0], 1.0, "σ(0) must be exactly 1: {ctx}");
        assert_eq!(s.sigmas[steps], 0.0, "σ(N) must be exactly 0: {ctx}");
        for (i, w) in s.sigmas.windows(2).enumerate() {
            assert!(w[1] < w[0], "σ({}) = {} is not below σ({i}) = {}: {ctx}", i + 1, w[1], w[0]);
        }
        for (t, sigma) in s.timesteps.iter().zip(&s.sigmas) {
            assert_eq!(*t, sigma * 1000.0, "{ctx}");
        }
    }
}

fn vectors() -> Value {
    let p = common::repo_root().join("tests/flow/vectors.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("vectors.json")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

#[track_caller]
fn assert_close(got: &[f64], want: &[f64], tol: f64, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "[{i}] {g} vs numpy {w}: {ctx}");
    }
}

#[test]
fn schedules_match_numpy_vectors() {
    let v = vectors();
    let cases = v["schedules"].as_array().unwrap();
    assert!(cases.len() > 50);
    for c in cases {
        let steps = c["steps"].as_u64().unwrap() as usize;
        let spacing = match c["spacing"].as_str().unwrap() {
            "flux" => Spacing::Flux,
            _ => Spacing::Diffusers,
        };
        let shift = match c["image_seq_len"].as_u64() {
            Some(len) => {
                let mu = DynamicShift::default().mu(len).unwrap();
                assert!((mu - c["mu"].as_f64().unwrap()).abs() < 1e-12, "mu for {len} tokens");
                Shift::Dynamic { mu }
            }
            None => Shift::Static(c["shift"].as_f64().unwrap()),
        };
        let ctx = format!("{steps} steps, {shift:?}, {spacing:?}");
        let s = FlowSchedule::new(steps, shift, spacing).unwrap();
        assert_close(&s.sigmas, &floats(&c["sigmas"]), 1e-12, &ctx);
        assert_close(&s.timesteps, &floats(&c["timesteps"]), 1e-12, &ctx);
    }
}

#[test]
fn strength_and_fill_maps_match_numpy_vectors() {
    let v = vectors();
    for c in v["strengths"].as_array().unwrap() {
        let steps = c["steps"].as_u64().unwrap() as usize;
        let strength = c["strength"].as_f64().unwrap();
        let s = FlowSchedule::new(steps, Shift::Static(3.0), Spacing::Diffusers).unwrap();
        let start = s.start_index(strength).unwrap();
        assert_eq!(start as u64, c["start"].as_u64().unwrap(), "{steps} steps, strength {strength}");
        let tail = s.with_strength(strength).unwrap();
        assert_eq!(tail.sigmas, s.sigmas[start..].to_vec());
        assert_eq!(tail.timesteps.len(), steps - start);
    }
    for c in v["fills"].as_array().unwrap() {
        let n = c["n"].as_i64().unwrap();
        let before = c["before"].as_i64().unwrap();
        let reflect = c["mode"] == "reflect";
        let want: Vec<i64> = c["index"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        let got: Vec<i64> = (0..want.len() as i64).map(|i| outpaint::source_index(i - before, n, reflect)).collect();
        assert_eq!(got, want, "{c}");
    }
}

#[test]
fn schedule_rejects_bad_settings() {
    for (steps, shift) in [(0, Shift::Static(1.0)), (4, Shift::Static(0.0)), (4, Shift::Static(-2.0))] {
        assert!(FlowSchedule::new(steps, shift, Spacing::Diffusers).is_err());
    }
    for shift in [Shift::Static(f64::NAN), Shift::Dynamic { mu: f64::INFINITY }, Shift::Dynamic { mu: 800.0 }] {
        assert!(FlowSchedule::new(4, shift, Spacing::Flux).is_err(), "{shift:?}");
    }
    let s = FlowSchedule::new(4, Shift::Static(1.0), Spacing::Diffusers).unwrap();
    assert!(s.start_index(1.5).is_err() && s.start_index(-0.1).is_err());
    assert_eq!(flow::image_seq_len(1024, 1024), 4096);
    assert_eq!(flow::image_seq_len(1000, 520), 62 * 32);
}

/// A deterministic pseudo-random sequence in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn euler_constant_velocity_drift_f32() {
    let _g = MLX.lock().unwrap_or_else(|e| e.into_inner());
    mlx::runtime::set_default_device(mlx::runtime::Device::Cpu).unwrap();
    let shape = [2, 4, 8, 8];
    let n: usize = shape.iter().product::<i32>() as usize;
    let x0_host = noise(n, 1);
    let v_host: Vec<f32> = noise(n, 2).iter().map(|v| v * 3.0).collect();
    let x0 = Array::from_slice(&x0_host, &shape).unwrap();
    let v = Array::from_slice(&v_host, &shape).unwrap();
    for steps in STEPS {
        for shift in [Shift::Static(1.0), Shift::Static(3.0), Shift::Dynamic { mu: 1.15 }] {
            let s = FlowSchedule::new(steps, shift, Spacing::Diffusers).unwrap();
            let mut x = x0.clone();
            for i in 0..steps {
                x = s.step(i, &x, &v).unwrap();
                if i % 64 == 63 {
                    x.eval().unwrap();
                }
            }
            assert_eq!(x.dtype(), Dtype::F32);
            assert_eq!(x.shape(), shape.to_vec());
            let got = x.to_vec::<f32>().unwrap();
            let drift =
                got.iter().zip(&x0_host).zip(&v_host).map(|((x, x0), v)| ((x - x0) + v).abs()).fold(0.0f32, f32::max);
            assert!(drift < 5e-4, "{steps} steps, {shift:?}: Δx = −v off by {drift}");
        }
    }
}

#[test]
fn euler_step_any_shape_and_dtype() {
    let _g = MLX.lock().unwrap_or_else(|e| e.into_inner());
    mlx::runtime::set_default_device(mlx::runtime::Device::Cpu).unwrap();
    for shape in [vec![7], vec![3, 5], vec![1, 16, 4, 4], vec![2, 3, 1, 5, 2]] {
        let n: usize = shape.iter().product::<i32>() as usize;
        let xh = noise(n, 3);
        let vh = noise(n, 4);
        for (dtype, tol) in [(Dtype::F32, 1e-6f32), (Dtype::F16, 2e-3), (Dtype::BF16, 1.6e-2)] {
            let x = Array::from_slice(&xh, &shape).unwrap().astype(dtype).unwrap();
            let v = Array::from_slice(&vh, &shape).unwrap().astype(dtype).unwrap();
            let out = flow::euler_step(&x, &v, 0.75, 0.5).unwrap();
            assert_eq!(out.dtype(), dtype);
            assert_eq!(out.shape(), shape);
            // The reference uses the inputs as rounded to `dtype`.
            let (xr, vr) = (x.to_vec::<f32>().unwrap(), v.to_vec::<f32>().unwrap());
            for ((o, x), v) in out.to_vec::<f32>().unwrap().iter().zip(&xr).zip(&vr) {
                assert!((o - (x - 0.25 * v)).abs() <= tol, "{dtype}: {o} vs {}", x - 0.25 * v);
            }
            let noisy = flow::scale_noise(&x, &v, 0.25).unwrap();
            assert_eq!((noisy.dtype(), noisy.shape()), (dtype, shape.clone()));
            for ((o, x), v) in noisy.to_vec::<f32>().unwrap().iter().zip(&xr).zip(&vr) {
                assert!((o - (0.25 * v + 0.75 * x)).abs() <= tol, "{dtype} scale_noise");
            }
        }
    }
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let bad_shape = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let ints = Array::from_slice(&[1u8, 2], &[2]).unwrap();
    assert!(flow::euler_step(&x, &bad_shape, 1.0, 0.5).is_err());
    assert!(flow::euler_step(&ints, &ints, 1.0, 0.5).is_err());
    let s = FlowSchedule::new(2, Shift::Static(1.0), Spacing::Diffusers).unwrap();
    assert!(s.step(2, &x, &x).is_err());
}

fn run(args: &[&str]) -> Output {
    common::mlx_gen(args, None)
}

use common::assert_error;

#[test]
fn flow_schedule_command() {
    let check = |args: &[&str], want: FlowSchedule| {
        let out = run(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        // serde_json's default float parsing may be one ulp off the printed shortest round-trip form.
        let ctx = format!("{args:?}");
        assert_close(&floats(&v["sigmas"]), &want.sigmas, 1e-15, &ctx);
        assert_close(&floats(&v["timesteps"]), &want.timesteps, 1e-15, &ctx);
    };
    let mu4096 = DynamicShift::default().mu(4096).unwrap();
    check(
        &["flow-schedule", "--steps", "28", "--shift", "3", "--json"],
        FlowSchedule::new(28, Shift::Static(3.0), Spacing::Diffusers).unwrap(),
    );
    check(
        &["flow-schedule", "--steps", "4", "--json"],
        FlowSchedule::new(4, Shift::Static(1.0), Spacing::Diffusers).unwrap(),
    );
    check(
        &["flow-schedule", "--steps", "50", "--image-seq-len", "4096", "--spacing", "flux", "--json"],
        FlowSchedule::new(50, Shift::Dynamic { mu: mu4096 }, Spacing::Flux).unwrap(),
    );
    check(
        &["flow-schedule", "--steps", "10", "--mu", "-0.5", "--json"],
        FlowSchedule::new(10, Shift::Dynamic { mu: -0.5 }, Spacing::Diffusers).unwrap(),
    );
    let full = FlowSchedule::new(10, Shift::Static(3.0), Spacing::Diffusers).unwrap();
    check(
        &["flow-schedule", "--steps", "10", "--shift", "3", "--strength", "0.6", "--json"],
        full.with_strength(0.6).unwrap(),
    );
    let table = run(&["flow-schedule", "--steps", "3"]);
    assert_eq!(String::from_utf8_lossy(&table.stdout).lines().count(), 5);

    assert_error(&run(&["flow-schedule", "--steps", "0", "--json"]), 2, &["--steps"]);
    assert_error(&run(&["flow-schedule", "--steps", "4", "--shift", "2", "--image-seq-len", "9"]), 2, &["--shift"]);
    assert_error(&run(&["flow-schedule", "--steps", "4", "--shift", "0"]), 1, &["shift"]);
    assert_error(&run(&["flow-schedule", "--steps", "4", "--shift", "-1"]), 1, &["shift must be"]);
    assert_error(&run(&["flow-schedule", "--steps", "4", "--shift", "nan"]), 1, &["shift"]);
    assert_error(&run(&["flow-schedule", "--steps", "1000", "--mu", "40"]), 1, &["strictly decreases"]);
    assert_error(&run(&["flow-schedule", "--steps", "4", "--strength", "2"]), 1, &["strength"]);
}

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("accuracy_test");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Pseudo-random test images of odd sizes in several layouts and bit depths.
fn test_images() -> Vec<(&'static str, DynamicImage)> {
    let bytes = |w: u32, h: u32, c: u32, seed: u64| -> Vec<u8> {
        noise((w * h * c) as usize, seed).iter().map(|v| ((v + 1.0) * 127.9) as u8).collect()
    };
    let words = |w: u32, h: u32, c: u32, seed: u64| -> Vec<u16> {
        noise((w * h * c) as usize, seed).iter().map(|v| ((v + 1.0) * 32767.9) as u16).collect()
    };
    vec![
        ("rgb", DynamicImage::ImageRgb8(ImageBuffer::from_raw(13, 7, bytes(13, 7, 3, 10)).unwrap())),
        ("rgba", DynamicImage::ImageRgba8(ImageBuffer::from_raw(5, 11, bytes(5, 11, 4, 11)).unwrap())),
        ("gray", DynamicImage::ImageLuma8(ImageBuffer::from_raw(9, 3, bytes(9, 3, 1, 12)).unwrap())),
        ("gray_alpha", DynamicImage::ImageLumaA8(ImageBuffer::from_raw(3, 5, bytes(3, 5, 2, 13)).unwrap())),
        ("rgb16", DynamicImage::ImageRgb16(ImageBuffer::from_raw(7, 9, words(7, 9, 3, 14)).unwrap())),
        ("gray16", DynamicImage::ImageLuma16(ImageBuffer::from_raw(1, 1, words(1, 1, 1, 15)).unwrap())),
    ]
}

/// All samples of an image as u16, with the channel count.
fn samples(img: &DynamicImage) -> (Vec<u16>, usize) {
    let c = img.color().channel_count() as usize;
    let v = match img {
        DynamicImage::ImageLuma8(b) => b.as_raw().iter().map(|&x| x.into()).collect(),
        DynamicImage::ImageLumaA8(b) => b.as_raw().iter().map(|&x| x.into()).collect(),
        DynamicImage::ImageRgb8(b) => b.as_raw().iter().map(|&x| x.into()).collect(),
        DynamicImage::ImageRgba8(b) => b.as_raw().iter().map(|&x| x.into()).collect(),
        DynamicImage::ImageLuma16(b) => b.as_raw().clone(),
        DynamicImage::ImageRgb16(b) => b.as_raw().clone(),
        other => panic!("unexpected layout {:?}", other.color()),
    };
    (v, c)
}

fn read(p: &Path) -> DynamicImage {
    image::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn outpaint_prep_conserves_pixels_and_masks_are_binary() {
    let pads = [(0, 0, 0, 0), (3, 0, 0, 0), (1, 2, 3, 4), (0, 5, 17, 0), (20, 1, 0, 9)];
    for (name, img) in test_images() {
        let src_path = tmp(&format!("{name}.png"));
        img.save(&src_path).unwrap();
        let (src, c) = samples(&img);
        let (w, h) = (img.width() as usize, img.height() as usize);
        let bits16 = matches!(img, DynamicImage::ImageLuma16(_) | DynamicImage::ImageRgb16(_));
        for (fill, align) in
            [("edge", 1u32), ("reflect", 16), ("color:#3a7Fc0", 8), ("edge", 16), ("reflect", 1), ("color:#000000", 64)]
        {
            for (l, t, r, b) in pads {
                let ctx = format!("{name} fill {fill} align {align} pad {l},{t},{r},{b}");
                let (canvas, mask, soft) = (tmp("canvas.png"), tmp("mask.png"), tmp("soft.png"));
                let pad = format!("{l},{t},{r},{b}");
                let out = run(&[
                    "outpaint-prep",
                    "--image",
                    src_path.to_str().unwrap(),
                    "--pad",
                    &pad,
                    "--canvas",
                    canvas.to_str().unwrap(),
                    "--mask",
                    mask.to_str().unwrap(),
                    "--fill",
                    fill,
                    "--align",
                    &align.to_string(),
                    "--feather",
                    "3",
                    "--soft-mask",
                    soft.to_str().unwrap(),
                ]);
                assert!(out.status.success(), "{ctx}: {}", String::from_utf8_lossy(&out.stderr));
                let cimg = read(&canvas);
                assert_eq!(cimg.color(), img.color(), "{ctx}: layout kept");
                let (cw, ch) = (cimg.width() as usize, cimg.height() as usize);
                assert!(cw % align as usize == 0 && ch % align as usize == 0, "{ctx}: {cw}x{ch} not aligned");
                assert!(cw >= w + l + r && ch >= h + t + b, "{ctx}: padding shrank");
                assert!(cw < w + l + r + align as usize && ch < h + t + b + align as usize, "{ctx}: grew too much");
                // Where the source sits: the padding grows only on padded sides (or evenly when neither is).
                let ex = cw - (w + l + r);
                let ey = ch - (h + t + b);
                let ox = match (l > 0, r > 0) {
                    (true, false) => l + ex,
                    (false, true) => l,
                    _ => l + ex / 2,
                };
                let oy = match (t > 0, b > 0) {
                    (true, false) => t + ey,
                    (false, true) => t,
                    _ => t + ey / 2,
                };
                let (cs, _) = samples(&cimg);
                let m = read(&mask).to_luma8();
                assert_eq!((m.width() as usize, m.height() as usize), (cw, ch), "{ctx}: mask size");
                let sm = read(&soft).to_luma8();
                let color: Option<Vec<u16>> = fill.strip_prefix("color:").map(|hex| {
                    let rgb = outpaint::parse_color(hex).unwrap();
                    outpaint::color_samples(rgb, c)
                        .into_iter()
                        .map(|v| if bits16 { u16::from(v) * 257 } else { v.into() })
                        .collect()
                });
                for y in 0..ch {
                    for x in 0..cw {
                        let inside = (ox..ox + w).contains(&x) && (oy..oy + h).contains(&y);
                        let mv = m.get_pixel(x as u32, y as u32).0[0];
                        assert_eq!(mv, if inside { 0 } else { 255 }, "{ctx}: mask at ({x}, {y})");
                        let px = &cs[(y * cw + x) * c..][..c];
                        let reflect = fill == "reflect";
                        let sx = outpaint::source_index(x as i64 - ox as i64, w as i64, reflect) as usize;
                        let sy = outpaint::source_index(y as i64 - oy as i64, h as i64, reflect) as usize;
                        let want = match (&color, inside) {
                            (Some(col), false) => &col[..],
                            _ => &src[(sy * w + sx) * c..][..c],
                        };
                        assert_eq!(px, want, "{ctx}: pixel ({x}, {y})");
                        let sv = sm.get_pixel(x as u32, y as u32).0[0];
                        if inside {
                            assert!(sv < 255, "{ctx}: soft mask over the source")
                        } else {
                            assert_eq!(sv, 255, "{ctx}: soft mask over padding")
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn soft_mask_ramp_and_binary_mask_are_separate() {
    let pad = Pad { left: 2, top: 0, right: 0, bottom: 0 };
    let soft = outpaint::soft_mask(6, 1, pad, 3);
    assert_eq!(soft.data, vec![255, 255, 191, 128, 64, 0, 0, 0]);
    assert_eq!(outpaint::mask(6, 1, pad).data, vec![255, 255, 0, 0, 0, 0, 0, 0]);
    assert!(outpaint::soft_mask(4, 4, Pad::default(), 5).data.iter().all(|&v| v == 0));
    assert_eq!(
        outpaint::aligned_pad(13, 7, Pad { left: 0, top: 0, right: 0, bottom: 0 }, 16).unwrap(),
        Pad { left: 1, top: 4, right: 2, bottom: 5 }
    );
    assert!(outpaint::aligned_pad(13, 7, Pad::default(), 0).is_err());
    assert_eq!(Pad::parse("4").unwrap(), Pad { left: 4, top: 4, right: 4, bottom: 4 });
    for bad in ["1,2,3", "-1,0,0,0", "a,b,c,d", "99999,0,0,0", "", "1,,2,3"] {
        assert!(Pad::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn outpaint_prep_bad_input() {
    let src = tmp("bad_src.png");
    DynamicImage::ImageRgb8(ImageBuffer::from_raw(3, 3, vec![7u8; 27]).unwrap()).save(&src).unwrap();
    let text = tmp("not_an_image.png");
    std::fs::write(&text, "hello, not a picture\n").unwrap();
    let (canvas, mask) = (tmp("bad_canvas.png"), tmp("bad_mask.png"));
    let (cs, ms) = (canvas.to_str().unwrap(), mask.to_str().unwrap());
    let go = |image: &str, pad: &str, extra: &[&str]| {
        let mut a = vec!["outpaint-prep", "--image", image, "--pad", pad, "--canvas", cs, "--mask", ms];
        a.extend_from_slice(extra);
        run(&a)
    };
    let s = src.to_str().unwrap();
    assert_error(&go("/nonexistent/in.png", "1,1,1,1", &[]), 1, &["/nonexistent/in.png"]);
    assert_error(&go(text.to_str().unwrap(), "1,1,1,1", &[]), 1, &["not_an_image.png", "image"]);
    assert_error(&go(s, "-4,0,0,0", &[]), 1, &["negative"]);
    assert_error(&go(s, "0,0,100000,0", &[]), 1, &["too large"]);
    assert_error(&go(s, "16384,0,16384,0", &[]), 1, &["16384"]);
    assert_error(&go(s, "1,2", &[]), 1, &["LEFT,TOP,RIGHT,BOTTOM"]);
    assert_error(&go(s, "1,1,1,1", &["--fill", "blur"]), 1, &["--fill"]);
    assert_error(&go(s, "1,1,1,1", &["--fill", "color:#12345"]), 1, &["#RRGGBB"]);
    assert_error(&go(s, "1,1,1,1", &["--align", "0"]), 1, &["alignment"]);
    assert_error(&go(s, "1,1,1,1", &["--feather", "3"]), 2, &["--soft-mask"]);
    let jpg = run(&["outpaint-prep", "--image", s, "--pad", "1", "--canvas", "out.jpg", "--mask", ms]);
    assert_error(&jpg, 1, &[".png"]);
}

//! Host and device time of one continuous-batching step against the batch size, for a model
//! folder: `cargo run --release -p engine --example batch_step_cost -- MODEL [B...]`.
//! Every sequence gets a different prompt length (so rows are padded, as in a server). With
//! `MLX_GEN_TRACE` set, each line adds the steps' stage split.
//!
//! `batch_step_cost MODEL --prefill ROWSxLEN[@STEP]...`: the newcomers' prefill alone: ROWS prompts
//! of LEN tokens (each its own tokens) added at once and stepped until every one is decoding, with
//! a per-step budget of STEP padded positions (default 512, `serve --prefill-step-size`); three
//! trials, the first meeting the shapes' first-use costs. Prints prompt tok/s, forwards and the
//! steps' stage split (`MLX_GEN_TRACE`).
//!
//! `batch_step_cost --qmm [ROWS...]`: the quantized product of a few rows (`mlx::fast::qmm_rows`,
//! ours on a CUDA GPU for 1-7 rows; `mlx::fast::qmm_mma`, ours on the tensor cores, for 8-256; default 1, 2, 4, 5, 7) against MLX's `quantized_matmul`, 4-bit g64 bfloat16 weights of the shapes of
//! a Llama-3.2-3B layer and of a Qwen2.5-7B layer (fused projections): the largest difference
//! relative to MLX's largest output, microseconds a product of each (100 products queued at once,
//! median of 6 such batches) and the weight bytes read a second at that pace.
//!
//! `batch_step_cost --gather [TOKENS...]`: the gathered product of a few tokens
//! (`mlx::fast::gather_qmm_rows`, ours on a CUDA GPU) against MLX's `gather_qmm`, Mixtral-8x7B's
//! experts (8 of 14336 x 4096, 4-bit g64 bfloat16), 2 experts a token: the up projection (a row a
//! token) and the down one (a row a slot), the largest difference relative to MLX's largest output
//! and microseconds a product.
//!
//! `batch_step_cost --route [TOKENS...]`: a mixture of experts' router choice as one kernel (`Routing::choose`
//! with the kernel, ours on a CUDA GPU) against mlx-lm's MLX operations, bfloat16 logits of the
//! routers of qwen3_moe (128 experts, top 8, renormalised), qwen2_moe (60, top 4), mixtral (8, top
//! 2, softmax after the choice) and deepseek_v2 (64, top 6, scaled): rows whose experts differ, the
//! largest weight difference, microseconds a call each way.
//!
//! `batch_step_cost --attn`: the few-position attention kernel (`mlx::fast::sdpa_few`, ours on a CUDA
//! GPU) against MLX's `scaled_dot_product_attention`: a 32-row decode step over left-padded keys
//! (boolean and additive masks), a verification's 5 and 9 causal positions, head dims 64 and 128,
//! grouped heads; the largest difference relative to MLX's largest output, and microseconds a call.
//!
//! `batch_step_cost MODEL --forward [L...]`: one sequence's forward pass of L positions (default 1, 2,
//! 5, 8, 9, 16) over a 128-token cache, evaluated and waited for each time (a speculative
//! verification's cost without pipelining): first with the cache trimmed back after each pass (the
//! same key length every pass), then left to grow (a key length new each pass, as verification
//! rounds meet them); milliseconds a pass, median of 20 after 3.
use engine::batch::{BatchEngine, SeqParams};
use engine::{LoadedModel, SamplerConfig};
use std::time::Instant;

fn params() -> SeqParams {
    SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false }
}

/// One prefill case "ROWSxLEN[@STEP]".
fn prefill_case(m: &LoadedModel, case: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (shape, step) = case.split_once('@').unwrap_or((case, "512"));
    let (rows, len) = shape.split_once('x').ok_or("a prefill case is ROWSxLEN[@STEP]")?;
    let (rows, len, step): (usize, usize, usize) = (rows.parse()?, len.parse()?, step.parse()?);
    let vocab = m.model.vocab_size() as u32;
    for trial in 0..3u32 {
        let mut engine = BatchEngine::new(m.model.as_ref(), step, None);
        for i in 0..rows {
            let salt = (trial as usize * rows + i) as u32;
            let prompt: Vec<u32> = (0..len as u32).map(|t| (t * 31 + salt * 17 + 1) % (vocab - 1) + 1).collect();
            engine.add(i as u64, prompt, params())?;
        }
        let _ = engine.take_trace();
        let t0 = Instant::now();
        let mut steps = 0;
        while engine.len().1 > 0 {
            engine.step()?;
            steps += 1;
        }
        engine.step()?; // every first token read
        let dt = t0.elapsed().as_secs_f64();
        let trace = engine.take_trace().map(|t| format!("; {}", t.summary())).unwrap_or_default();
        println!(
            "prefill {rows}x{len} step {step} trial {trial}: {:.1} ms, {:.0} prompt tok/s, {steps} steps{trace}",
            1e3 * dt,
            (rows * len) as f64 / dt
        );
    }
    Ok(())
}

/// Microseconds a call of `f`: `calls` calls queued at once and evaluated together, the median of 6
/// such batches.
fn us_per_call(calls: usize, f: impl Fn() -> mlx::Result<mlx::Array>) -> Result<f64, Box<dyn std::error::Error>> {
    let mut t = Vec::new();
    for _ in 0..6 {
        let ys: Vec<mlx::Array> = (0..calls).map(|_| f()).collect::<Result<_, _>>()?;
        let t0 = Instant::now();
        mlx::eval(&ys.iter().collect::<Vec<_>>())?;
        t.push(t0.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[3])
}

/// The largest |ours - theirs| over the largest |theirs| (float32 arrays of one shape).
fn rel_max_diff(ours: &mlx::Array, theirs: &mlx::Array) -> mlx::Result<f32> {
    let all = |a: mlx::Array| -> mlx::Result<f32> { a.reshape(&[-1])?.max(&[0], false)?.item::<f32>() };
    Ok(all(ours.sub(theirs)?.abs()?)? / all(theirs.abs()?)?)
}

/// `--qmm`: ours against MLX's for each weight shape and row count.
fn qmm_case(rows: &[i32]) -> Result<(), Box<dyn std::error::Error>> {
    use mlx::ops::QuantSpec;
    use mlx::{Array, Dtype};
    let spec = QuantSpec::affine(64, 4);
    for (n, k) in [(3072, 3072), (5120, 3072), (16384, 3072), (3072, 8192), (4608, 3584), (37888, 3584), (3584, 18944)] {
        let w = mlx::random::uniform(&[n, k], Dtype::F32)?.astype(Dtype::BF16)?;
        let (wq, s, b) = mlx::ops::quantize(&w, spec)?;
        mlx::eval(&[&wq, &s])?;
        for &m in rows {
            let x = mlx::random::uniform(&[m, k], Dtype::F32)?.astype(Dtype::BF16)?;
            mlx::eval(&[&x])?;
            // 1-7 rows: the few-row kernel; 8 and more: the tensor-core one.
            let ours = |x: &Array| {
                if m >= 8 {
                    mlx::fast::qmm_mma(x, &wq, &s, b.as_ref(), spec)
                } else {
                    mlx::fast::qmm_rows(x, &wq, &s, b.as_ref(), spec)
                }
            };
            let theirs = |x: &Array| mlx::ops::quantized_matmul(x, &wq, &s, b.as_ref(), true, spec);
            let (a, r) = (ours(&x)?.astype(Dtype::F32)?, theirs(&x)?.astype(Dtype::F32)?);
            let diff = rel_max_diff(&a, &r)?;
            let (to, tt) = (us_per_call(100, || ours(&x))?, us_per_call(100, || theirs(&x))?);
            // 4-bit values, a bfloat16 scale and bias a group of 64.
            let gb = |us: f64| f64::from(n) * f64::from(k) * (0.5 + 4.0 / 64.0) / us / 1e3;
            println!(
                "qmm {n}x{k} rows {m:2}: ours {to:7.1} us ({:5.0} GB/s), MLX {tt:7.1} us ({:5.0} GB/s) ({:.2}x), max diff {diff:.2e} of MLX's max",
                gb(to),
                gb(tt),
                tt / to
            );
        }
    }
    Ok(())
}

/// `--gather`: ours against MLX's gathered product, for each token count.
fn gather_case(tokens: &[i32]) -> Result<(), Box<dyn std::error::Error>> {
    use mlx::ops::QuantSpec;
    use mlx::{Array, Dtype};
    let spec = QuantSpec::affine(64, 4);
    let (experts, k) = (8, 2);
    for (n, kin, per_slot) in [(14336, 4096, false), (4096, 14336, true)] {
        let w = mlx::random::uniform(&[experts, n, kin], Dtype::F32)?.astype(Dtype::BF16)?;
        let (wq, s, b) = mlx::ops::quantize(&w, spec)?;
        mlx::eval(&[&wq, &s])?;
        for &t in tokens {
            let rows = if per_slot { t * k } else { t };
            let x = mlx::random::uniform(&[rows, kin], Dtype::F32)?.astype(Dtype::BF16)?;
            let idx = Array::from_slice(&(0..t * k).map(|i| ((i * 3 + i / k) % experts) as u32).collect::<Vec<_>>(), &[t, k])?;
            mlx::eval(&[&x, &idx])?;
            let ours = |x: &Array| mlx::fast::gather_qmm_rows(x, &wq, &s, b.as_ref(), &idx, spec);
            // MLX's, as mlx-lm's SwitchLinear calls it: x (T, 1, 1, in) or (T, k, 1, in).
            let theirs = |x: &Array| -> mlx::Result<Array> {
                let xs = if per_slot { x.reshape(&[t, k, 1, kin])? } else { x.reshape(&[t, 1, 1, kin])? };
                mlx::ops::gather_qmm(&xs, &wq, &s, b.as_ref(), Some(&idx), true, spec, false)?.reshape(&[t, k, n])
            };
            let (a, r) = (ours(&x)?.astype(Dtype::F32)?, theirs(&x)?.astype(Dtype::F32)?);
            let diff = rel_max_diff(&a, &r)?;
            let (to, tt) = (us_per_call(50, || ours(&x))?, us_per_call(50, || theirs(&x))?);
            println!("gather {n}x{kin} tokens {t} x {k} experts: ours {to:7.1} us, MLX {tt:7.1} us ({:.2}x), max diff {diff:.2e} of MLX's max", tt / to);
        }
    }
    Ok(())
}

/// `--route`: the router kernel against MLX's operations, for each token count.
fn route_case(tokens: &[i32]) -> Result<(), Box<dyn std::error::Error>> {
    use engine::nn::moe::Routing;
    use mlx::Dtype;
    let cases = [
        ("qwen3_moe", 128, Routing { select_from_top: true, normalize: true, ..Routing::softmax_top_k(8) }),
        ("qwen2_moe", 60, Routing::softmax_top_k(4)),
        ("mixtral", 8, Routing { score_after_select: true, ..Routing::softmax_top_k(2) }),
        ("deepseek_v2", 64, Routing { scaling: Some(1.0), ..Routing::softmax_top_k(6) }),
        ("deepseek_v2 x2.5", 64, Routing { scaling: Some(2.5), ..Routing::softmax_top_k(6) }),
    ];
    for (name, experts, routing) in cases {
        for (&t, ties) in tokens.iter().flat_map(|t| [(t, false), (t, true)]) {
            // Logits in [-4, 4), continuous or in steps of 1/8 (many exact ties).
            let g = if ties {
                mlx::random::randint(-32, 32, &[t, experts], Dtype::I32)?.astype(Dtype::F32)?.div_scalar(8.0)?
            } else {
                mlx::random::uniform(&[t, experts], Dtype::F32)?.mul_scalar(8.0)?.sub_scalar(4.0)?
            };
            let g = g.astype(Dtype::BF16)?;
            mlx::eval(&[&g])?;
            let (ki, kw) = routing.choose(&g, None, true)?;
            let (mi, mw) = routing.choose(&g, None, false)?;
            mlx::eval(&[&ki, &kw, &mi, &mw])?;
            let (kiv, miv): (Vec<u32>, Vec<u32>) = (ki.to_vec()?, mi.to_vec()?);
            let (kwv, mwv): (Vec<f32>, Vec<f32>) = (kw.astype(Dtype::F32)?.to_vec()?, mw.astype(Dtype::F32)?.to_vec()?);
            let k = routing.top_k as usize;
            let (mut sets, mut orders, mut wmax) = (0, 0, 0f32);
            for r in 0..t as usize {
                let (a, b) = (&kiv[r * k..(r + 1) * k], &miv[r * k..(r + 1) * k]);
                let (mut sa, mut sb) = (a.to_vec(), b.to_vec());
                sa.sort_unstable();
                sb.sort_unstable();
                if sa != sb {
                    sets += 1;
                } else if a != b {
                    orders += 1;
                }
                if a == b {
                    for j in 0..k {
                        wmax = wmax.max((kwv[r * k + j] - mwv[r * k + j]).abs());
                    }
                }
            }
            let (r, gr) = (&routing, &g);
            let call = |kernel: bool| {
                move || r.choose(gr, None, kernel).map(|(i, _)| i).map_err(|e| mlx::Error::new("route", e.to_string()))
            };
            let (tk, tm) = (us_per_call(50, call(true))?, us_per_call(50, call(false))?);
            println!(
                "route {name} {experts} experts top {k}, {t} tokens{}: {sets} rows choose other experts, {orders} in another \
                 order, largest weight difference {wmax:.3e} where equal; kernel {tk:.1} us, MLX {tm:.1} us",
                if ties { " (ties)" } else { "" }
            );
        }
    }
    Ok(())
}

/// `--attn`: ours against MLX's attention.
fn attn_case() -> Result<(), Box<dyn std::error::Error>> {
    use mlx::fast::Mask;
    use mlx::{Array, Dtype};
    // (rows, query heads, kv heads, positions, keys, head dims, mask kind)
    for (b, hq, hkv, l, s, d, kind) in [(32, 24, 8, 1, 300, 128, "bool"), (32, 16, 8, 1, 700, 128, "additive"), (8, 9, 3, 1, 257, 64, "bool"), (1, 24, 8, 5, 400, 128, "causal"), (1, 16, 8, 9, 1000, 128, "causal"), (1, 14, 2, 9, 130, 64, "causal")] {
        let r = |shape: &[i32]| -> mlx::Result<Array> { mlx::random::uniform(shape, Dtype::F32)?.sub_scalar(0.5)?.mul_scalar(4.0)?.astype(Dtype::BF16) };
        let q = r(&[b, hq, l, d])?;
        // Keys as a cache keeps them: a view of the first `s` positions of a longer buffer.
        let kbuf = r(&[b, hkv, s + 256, d])?;
        let vbuf = r(&[b, hkv, s + 256, d])?;
        let (k, v) = (kbuf.slice_axis(2, 0, s)?, vbuf.slice_axis(2, 0, s)?);
        // Row i's keys start at i * 7 (left padding).
        let start = mlx::ops::arange(0.0, f64::from(b), 1.0, Dtype::I32)?.mul_scalar(7.0)?.reshape(&[b, 1, 1, 1])?;
        let keep = mlx::ops::arange(0.0, f64::from(s), 1.0, Dtype::I32)?.reshape(&[1, 1, 1, s])?.ge(&start)?;
        let additive = mlx::ops::where_(&keep, &Array::scalar(0.0, Dtype::BF16)?, &Array::scalar(Dtype::BF16.finfo_min(), Dtype::BF16)?)?;
        mlx::eval(&[&q, &kbuf, &vbuf, &keep, &additive])?;
        let mask = match kind {
            "bool" => Mask::Array(&keep),
            "additive" => Mask::Array(&additive),
            _ => Mask::Causal,
        };
        let scale = 1.0 / (d as f32).sqrt();
        let ours = mlx::fast::sdpa_few(&q, &k, &v, scale, mask)?.astype(Dtype::F32)?;
        let theirs = mlx::fast::sdpa(&q, &k, &v, scale, mask)?.astype(Dtype::F32)?;
        let diff = rel_max_diff(&ours, &theirs)?;
        let t = us_per_call(50, || mlx::fast::sdpa_few(&q, &k, &v, scale, mask))?;
        println!("attn B {b} Hq {hq} Hkv {hkv} L {l} S {s} D {d} {kind}: ours {t:.1} us, max diff {diff:.2e} of MLX's max");
    }
    Ok(())
}

/// `--forward`: a pass of `l` positions over a 128-token cache, trimmed back or growing.
fn forward_case(m: &LoadedModel, ls: &[i32]) -> Result<(), Box<dyn std::error::Error>> {
    let model = m.model.as_ref();
    let vocab = model.vocab_size() as u32;
    let ids = |n: i32, salt: u32| -> mlx::Result<mlx::Array> {
        let v: Vec<u32> = (0..n as u32).map(|t| (t * 31 + salt * 17 + 7) % (vocab - 1) + 1).collect();
        mlx::Array::from_slice(&v, &[1, n])
    };
    for &l in ls {
        let mut line = format!("forward L {l:2}:");
        for grow in [false, true] {
            let mut cache = model.make_cache();
            let logits = engine::nn::sdpa::with_fused_attention(|| model.forward(&ids(128, 0)?, &mut cache))?;
            mlx::eval(&[&logits])?;
            let mut t = Vec::new();
            for i in 0..23u32 {
                let x = ids(l, i + 1)?;
                let t0 = Instant::now();
                let logits = model.forward(&x, &mut cache)?; // (1, L, vocab)
                mlx::eval(&[&logits])?;
                if i >= 3 {
                    t.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                if !grow {
                    engine::cache::trim_prompt_cache(&mut cache, l)?;
                }
            }
            t.sort_by(f64::total_cmp);
            line += &format!(" {} {:.3} ms", if grow { "growing" } else { "fixed keys" }, t[t.len() / 2]);
        }
        println!("{line}");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: batch_step_cost MODEL [B...] | MODEL --prefill ROWSxLEN[@STEP]... | MODEL --forward [L...] | --qmm [ROWS...] | --gather [TOKENS...] | --route [TOKENS...] | --attn")?;
    let rest: Vec<String> = args.collect();
    if dir == "--attn" {
        return attn_case();
    }
    if dir == "--route" {
        let tokens: Vec<i32> = rest.iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
        return route_case(if tokens.is_empty() { &[1, 4, 64, 512] } else { &tokens });
    }
    if dir == "--gather" {
        let tokens: Vec<i32> = rest.iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
        return gather_case(if tokens.is_empty() { &[1, 2, 4] } else { &tokens });
    }
    if dir == "--qmm" {
        let rows: Vec<i32> = rest.iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
        return qmm_case(if rows.is_empty() { &[1, 2, 4, 5, 7] } else { &rows });
    }
    if mlx::runtime::gpu_available() {
        // As `mlx-gen serve` on a GPU (its default prefill chunk): masked and multi-position
        // attention composed of plain operations (see engine::nn::sdpa).
        mlx::runtime::set_env_default("MLX_MAX_OPS_PER_BUFFER", "80")?;
        engine::nn::sdpa::set_composed_max(512);
    }
    let m = LoadedModel::load(std::path::Path::new(&dir))?;
    if rest.first().map(String::as_str) == Some("--forward") {
        let ls: Vec<i32> = rest[1..].iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
        return forward_case(&m, if ls.is_empty() { &[1, 2, 5, 8, 9, 16] } else { &ls });
    }
    if rest.first().map(String::as_str) == Some("--prefill") {
        for case in &rest[1..] {
            prefill_case(&m, case)?;
        }
        return Ok(());
    }
    let sizes: Vec<usize> = rest.iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
    for b in if sizes.is_empty() { vec![1, 8, 32] } else { sizes } {
        let mut engine = BatchEngine::new(m.model.as_ref(), 4096, None);
        for i in 0..b {
            let prompt: Vec<u32> = (0..(20 + 7 * i) as u32).map(|t| (t * 31 + i as u32) % 200 + 1).collect();
            engine.add(i as u64, prompt, params())?;
        }
        for _ in 0..8 {
            engine.step()?; // prefill, join, warm up
        }
        let _ = engine.take_trace();
        let t0 = Instant::now();
        let steps = 64;
        for _ in 0..steps {
            engine.step()?;
        }
        let dt = t0.elapsed().as_secs_f64() / f64::from(steps);
        let trace = engine.take_trace().map(|t| format!("; {}", t.summary())).unwrap_or_default();
        println!("batch {b:3}: {:.2} ms per step, {:.0} tok/s{trace}", 1e3 * dt, b as f64 / dt);
    }
    Ok(())
}

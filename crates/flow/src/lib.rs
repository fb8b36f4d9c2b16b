//! Flow-matching (rectified-flow) sampling core of SD3/FLUX: the Euler discrete sigma schedule, the
//! Euler step on MLX arrays, img2img strength, and outpainting canvases.
//!
//! This crate is an image-model concern used by the CLI's `flow-schedule` and `outpaint-prep`
//! commands only: it owns the schedule maths and the canvas, never loads or runs a language model,
//! and depends on nothing of mlx-gen but the MLX bindings.
//!
//! The schedule follows diffusers' `FlowMatchEulerDiscreteScheduler.set_timesteps` (the published
//! formulas, computed in f64):
//!
//! * base sigmas: `np.linspace(σ_max·T, σ_min·T, N) / T` with T = 1000 training timesteps,
//!   σ_max = 1 and σ_min = the last sigma of the training grid `linspace(1, T, T)/T` (1/T, shifted
//!   by the static shift as diffusers' `__init__` does; unshifted with dynamic shifting)
//!   ([`Spacing::Diffusers`], what SD3 uses), or `np.linspace(1, 1/N, N)` as FluxPipeline passes
//!   them ([`Spacing::Flux`]);
//! * static shift s: σ' = s·σ / (1 + (s−1)·σ);
//! * dynamic shifting: `mu = m·image_seq_len + b` with m = (max_shift − base_shift) /
//!   (max_seq_len − base_seq_len) and b = base_shift − m·base_seq_len (diffusers' `calculate_shift`,
//!   FLUX defaults 0.5, 1.15, 256, 4096), then the exponential time shift
//!   σ' = e^mu / (e^mu + (1/σ − 1));
//! * timesteps = σ'·T for the N steps, and sigmas get a final 0 (N + 1 values).
//!
//! Both shifts are the same map σ' = σ / (σ + (1−σ)/a) with a = s or a = e^mu; it is evaluated in
//! that form, which gives σ'(1) = 1 exactly and never overflows. The Euler step is diffusers'
//! `step`: x ← x + (σ_next − σ)·v, computed in f32 and cast back to x's dtype.
pub mod outpaint;

use mlx::{Array, Dtype};

/// A bad schedule or canvas request, or an MLX failure in a step.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, FlowError>;

/// Number of training timesteps of SD3/FLUX (timesteps = σ·1000).
pub const NUM_TRAIN_TIMESTEPS: f64 = 1000.0;
/// The most steps a schedule may have.
pub const MAX_STEPS: usize = 100_000;

/// How the sigmas are shifted towards the noisy end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shift {
    /// Static shift s > 0 (1 = none, SD3 uses 3).
    Static(f64),
    /// Resolution-dependent shifting: the exponential time shift with this `mu`.
    Dynamic { mu: f64 },
}

/// Where the base (unshifted) sigmas come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Spacing {
    /// diffusers' default: evenly spaced timesteps from σ_max = 1 to σ_min of the training grid.
    #[default]
    Diffusers,
    /// FluxPipeline's `np.linspace(1.0, 1/N, N)`.
    Flux,
}

/// diffusers' `calculate_shift` parameters (the scheduler config of FLUX.1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DynamicShift {
    pub base_shift: f64,
    pub max_shift: f64,
    pub base_seq_len: f64,
    pub max_seq_len: f64,
}

impl Default for DynamicShift {
    fn default() -> Self {
        DynamicShift { base_shift: 0.5, max_shift: 1.15, base_seq_len: 256.0, max_seq_len: 4096.0 }
    }
}

impl DynamicShift {
    /// `mu` for an image of `image_seq_len` latent tokens: linear in the token count through
    /// (base_seq_len, base_shift) and (max_seq_len, max_shift).
    pub fn mu(&self, image_seq_len: u64) -> Result<f64> {
        let d = self.max_seq_len - self.base_seq_len;
        let vals = [self.base_shift, self.max_shift, self.base_seq_len, self.max_seq_len];
        if !vals.iter().all(|v| v.is_finite()) || d == 0.0 {
            return Err(FlowError::Invalid(format!(
                "dynamic shift needs finite values and max_seq_len != base_seq_len, got {self:?}"
            )));
        }
        let m = (self.max_shift - self.base_shift) / d;
        let b = self.base_shift - m * self.base_seq_len;
        Ok(image_seq_len as f64 * m + b)
    }
}

/// Latent tokens of a `width`×`height` image for FLUX/SD3 (VAE ÷8, then 2×2 patches): (H/16)·(W/16).
pub fn image_seq_len(width: u32, height: u32) -> u64 {
    u64::from(height / 16) * u64::from(width / 16)
}

/// σ / (σ + (1−σ)/a): the static shift (a = s) and the exponential time shift (a = e^mu) alike.
fn shift_map(sigma: f64, a: f64) -> f64 {
    if sigma >= 1.0 {
        return 1.0;
    }
    sigma / (sigma + (1.0 - sigma) / a)
}

/// numpy's `linspace(start, stop, n)` (endpoint included), element by element as numpy computes it.
fn linspace(start: f64, stop: f64, n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![start];
    }
    let step = (stop - start) / (n - 1) as f64;
    let mut v: Vec<f64> = (0..n).map(|i| i as f64 * step + start).collect();
    v[n - 1] = stop;
    v
}

/// A flow-matching Euler schedule: N steps, sigmas from 1 down to a final 0.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSchedule {
    /// N + 1 values: σ(0) = 1, strictly decreasing, σ(N) = 0.
    pub sigmas: Vec<f64>,
    /// N values: σ(i)·1000.
    pub timesteps: Vec<f64>,
}

impl FlowSchedule {
    /// The schedule of `steps` steps with `shift` and base `spacing` (see the module doc).
    pub fn new(steps: usize, shift: Shift, spacing: Spacing) -> Result<FlowSchedule> {
        if steps == 0 || steps > MAX_STEPS {
            return Err(FlowError::Invalid(format!("steps must be between 1 and {MAX_STEPS}, got {steps}")));
        }
        let a = match shift {
            Shift::Static(s) if s.is_finite() && s > 0.0 => s,
            Shift::Static(s) => {
                return Err(FlowError::Invalid(format!("shift must be a finite number > 0, got {s}")))
            }
            Shift::Dynamic { mu } if mu.is_finite() => mu.exp(),
            Shift::Dynamic { mu } => return Err(FlowError::Invalid(format!("mu must be finite, got {mu}"))),
        };
        if !a.is_finite() || a <= 0.0 {
            return Err(FlowError::Invalid(format!("the shift e^mu = {a} is out of range; use a smaller mu")));
        }
        let base = match spacing {
            Spacing::Diffusers => {
                let t = NUM_TRAIN_TIMESTEPS;
                let sigma_min = match shift {
                    Shift::Static(_) => shift_map(1.0 / t, a),
                    Shift::Dynamic { .. } => 1.0 / t,
                };
                linspace(t, sigma_min * t, steps).into_iter().map(|x| x / t).collect::<Vec<_>>()
            }
            Spacing::Flux => linspace(1.0, 1.0 / steps as f64, steps),
        };
        let mut sigmas: Vec<f64> = base.into_iter().map(|s| shift_map(s, a)).collect();
        let timesteps = sigmas.iter().map(|s| s * NUM_TRAIN_TIMESTEPS).collect();
        sigmas.push(0.0);
        if let Some(i) = sigmas.windows(2).position(|w| w[1] >= w[0]) {
            return Err(FlowError::Invalid(format!(
                "with this shift the {steps}-step schedule no longer strictly decreases (sigma {} = {} and \
                 sigma {} = {} at f64 precision); use a smaller shift or fewer steps",
                i,
                sigmas[i],
                i + 1,
                sigmas[i + 1]
            )));
        }
        Ok(FlowSchedule { sigmas, timesteps })
    }

    /// Number of steps N.
    pub fn steps(&self) -> usize {
        self.timesteps.len()
    }

    /// img2img: the step to start at for `strength` in [0, 1] (1 = from pure noise), as diffusers'
    /// `get_timesteps`: `int(max(N − min(N·strength, N), 0))`. Equals N (no steps) at strength 0.
    pub fn start_index(&self, strength: f64) -> Result<usize> {
        if !(0.0..=1.0).contains(&strength) {
            return Err(FlowError::Invalid(format!("strength must be between 0 and 1, got {strength}")));
        }
        let n = self.steps() as f64;
        let init = (n * strength).min(n);
        Ok((n - init).max(0.0) as usize)
    }

    /// img2img: the tail of the schedule that `strength` runs (sigmas from σ(start) to 0).
    pub fn with_strength(&self, strength: f64) -> Result<FlowSchedule> {
        let start = self.start_index(strength)?;
        Ok(FlowSchedule { sigmas: self.sigmas[start..].to_vec(), timesteps: self.timesteps[start..].to_vec() })
    }

    /// One Euler step i (0-based): x + (σ(i+1) − σ(i))·v.
    pub fn step(&self, i: usize, x: &Array, v: &Array) -> Result<Array> {
        if i >= self.steps() {
            return Err(FlowError::Invalid(format!("step {i} is past the last step {}", self.steps() - 1)));
        }
        euler_step(x, v, self.sigmas[i], self.sigmas[i + 1])
    }
}

fn check_float(what: &str, a: &Array) -> Result<()> {
    if a.dtype().is_float() {
        Ok(())
    } else {
        Err(FlowError::Invalid(format!("{what} must be a floating-point array, got {}", a.dtype())))
    }
}

fn check_pair(x: &Array, other: &Array, what: &str) -> Result<()> {
    check_float("the sample", x)?;
    check_float(what, other)?;
    if x.shape() != other.shape() {
        return Err(FlowError::Invalid(format!(
            "{what} has shape {:?} but the sample has shape {:?}",
            other.shape(),
            x.shape()
        )));
    }
    Ok(())
}

/// The flow-matching Euler step x ← x + (σ_next − σ)·v on arrays of any shape and float dtype
/// (f32, f16, bf16): computed in f32 (f64 stays f64) and cast back to x's dtype, as diffusers does.
pub fn euler_step(x: &Array, v: &Array, sigma: f64, sigma_next: f64) -> Result<Array> {
    check_pair(x, v, "the velocity")?;
    let work = if x.dtype() == Dtype::F64 { Dtype::F64 } else { Dtype::F32 };
    let dt = Array::scalar(sigma_next - sigma, work)?;
    let out = x.astype(work)?.add(&v.astype(work)?.mul(&dt)?)?;
    Ok(out.astype(x.dtype())?)
}

/// The forward process (diffusers' `scale_noise`): σ·noise + (1 − σ)·x0, in f32, cast back to x0's
/// dtype. With σ = σ(start) of an img2img schedule this is the starting latent.
pub fn scale_noise(x0: &Array, noise: &Array, sigma: f64) -> Result<Array> {
    check_pair(x0, noise, "the noise")?;
    let work = if x0.dtype() == Dtype::F64 { Dtype::F64 } else { Dtype::F32 };
    let s = Array::scalar(sigma, work)?;
    let keep = Array::scalar(1.0 - sigma, work)?;
    let out = noise.astype(work)?.mul(&s)?.add(&x0.astype(work)?.mul(&keep)?)?;
    Ok(out.astype(x0.dtype())?)
}

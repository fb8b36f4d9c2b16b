//! `mlx-gen flow-schedule`: print the flow-matching Euler schedule (sigmas and timesteps of diffusers' FlowMatchEulerDiscreteScheduler) as a table or JSON.
use anyhow::Result;
use flow::{DynamicShift, FlowSchedule, Shift, Spacing};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum SpacingArg {
    /// diffusers' default (SD3): timesteps evenly spaced from 1000 to the training grid's last.
    Diffusers,
    /// FluxPipeline's sigmas linspace(1, 1/N, N).
    Flux,
}

#[derive(clap::Args)]
pub struct Args {
    /// Number of denoising steps N (N + 1 sigmas, N timesteps).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=flow::MAX_STEPS as i64))]
    pub steps: u32,
    /// Static shift s: sigma' = s*sigma / (1 + (s-1)*sigma) (SD3: 3.0). Default 1 (no shift).
    #[arg(long, conflicts_with_all = ["image_seq_len", "mu"], allow_hyphen_values = true)]
    pub shift: Option<f64>,
    /// Dynamic shifting for an image of this many latent tokens ((H/16)*(W/16) for FLUX): mu by
    /// linear interpolation between --base-shift and --max-shift, then the exponential time shift.
    #[arg(long, conflicts_with = "mu")]
    pub image_seq_len: Option<u64>,
    /// Dynamic shifting with this mu directly.
    #[arg(long, allow_hyphen_values = true)]
    pub mu: Option<f64>,
    /// mu at --base-seq-len tokens.
    #[arg(long, default_value_t = 0.5, allow_hyphen_values = true)]
    pub base_shift: f64,
    /// mu at --max-seq-len tokens.
    #[arg(long, default_value_t = 1.15, allow_hyphen_values = true)]
    pub max_shift: f64,
    /// Token count where mu = --base-shift.
    #[arg(long, default_value_t = 256.0)]
    pub base_seq_len: f64,
    /// Token count where mu = --max-shift.
    #[arg(long, default_value_t = 4096.0)]
    pub max_seq_len: f64,
    /// Where the unshifted sigmas come from.
    #[arg(long, value_enum, default_value = "diffusers")]
    pub spacing: SpacingArg,
    /// img2img: print only the part of the schedule that this strength (0..1) runs.
    #[arg(long)]
    pub strength: Option<f64>,
    /// Print {"sigmas": [...], "timesteps": [...]} instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn schedule(args: &Args) -> Result<FlowSchedule> {
    let shift = if let Some(len) = args.image_seq_len {
        let d = DynamicShift {
            base_shift: args.base_shift,
            max_shift: args.max_shift,
            base_seq_len: args.base_seq_len,
            max_seq_len: args.max_seq_len,
        };
        Shift::Dynamic { mu: d.mu(len)? }
    } else if let Some(mu) = args.mu {
        Shift::Dynamic { mu }
    } else {
        Shift::Static(args.shift.unwrap_or(1.0))
    };
    let spacing = match args.spacing {
        SpacingArg::Diffusers => Spacing::Diffusers,
        SpacingArg::Flux => Spacing::Flux,
    };
    let s = FlowSchedule::new(args.steps as usize, shift, spacing)?;
    Ok(match args.strength {
        Some(strength) => s.with_strength(strength)?,
        None => s,
    })
}

pub fn run(args: &Args) -> Result<()> {
    let s = schedule(args)?;
    if args.json {
        let v = serde_json::json!({ "sigmas": s.sigmas, "timesteps": s.timesteps });
        println!("{v}");
        return Ok(());
    }
    println!("{:>6}  {:>22}  {:>22}", "step", "sigma", "timestep");
    for (i, sigma) in s.sigmas.iter().enumerate() {
        match s.timesteps.get(i) {
            Some(t) => println!("{i:>6}  {sigma:>22.17}  {t:>22.14}"),
            None => println!("{i:>6}  {sigma:>22.17}  {:>22}", "-"),
        }
    }
    Ok(())
}

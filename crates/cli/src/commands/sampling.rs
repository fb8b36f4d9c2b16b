//! The sampling flags shared by `generate` and `chat` (names as `mlx_lm.generate`'s).
use anyhow::Result;
use engine::SamplerConfig;

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temp: f64,
    /// Nucleus sampling: keep the smallest set of tokens with this probability mass (1: off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f64,
    /// Keep tokens at least this fraction as likely as the most likely one (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f64,
    /// Tokens that min-p never removes.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub min_tokens_to_keep: i32,
    /// Sample only from the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub top_k: i32,
    /// Seed of MLX's random generator.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The validated sampler settings.
    pub fn sampler_config(&self) -> Result<SamplerConfig> {
        let config = SamplerConfig {
            temp: self.temp,
            top_p: self.top_p,
            min_p: self.min_p,
            min_tokens_to_keep: self.min_tokens_to_keep,
            top_k: self.top_k,
        };
        config.validate()?;
        Ok(config)
    }
}

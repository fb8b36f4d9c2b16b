//! The sampling flags shared by `generate` and `chat` (names as `mlx_lm.generate`'s, plus the logits processors of mlx-lm's `make_logits_processors`).
use anyhow::{bail, Result};
use engine::sample::LogitsProcessors;
use engine::{LoadedModel, SamplerConfig};

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
    /// XTC: the probability, per token, of removing the top choices (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub xtc_probability: f64,
    /// XTC: tokens above this probability (all but the least likely of them) are removed; in [0, 0.5].
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub xtc_threshold: f64,
    /// Divide positive (multiply negative) logits of recent tokens by this factor (0 or unset: off).
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f64>,
    /// Recent tokens the repetition penalty looks at (0: the whole history).
    #[arg(long, default_value_t = 20)]
    pub repetition_context_size: usize,
    /// Subtract this from the logit of every token present in the recent history (0 or unset: off).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f64>,
    /// Recent tokens the presence penalty looks at (0: the whole history).
    #[arg(long, default_value_t = 20)]
    pub presence_context_size: usize,
    /// Subtract this from a token's logit once per occurrence in the recent history (0 or unset: off).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f64>,
    /// Recent tokens the frequency penalty looks at (0: the whole history).
    #[arg(long, default_value_t = 20)]
    pub frequency_context_size: usize,
    /// Add BIAS to token ID's logit: `ID=BIAS`, repeatable or comma-separated (`5=-inf` bans 5).
    #[arg(long, value_name = "ID=BIAS", value_delimiter = ',', allow_hyphen_values = true)]
    pub logit_bias: Vec<String>,
    /// With `--output json`: report each generated token's log-probability (`logprobs`).
    #[arg(long)]
    pub logprobs: bool,
    /// With `--output json`: also the K most likely tokens of each step (`top_logprobs`); implies --logprobs.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_logprobs: usize,
    /// Seed of MLX's random generator (seeded as mlx_lm.generate does, before the model is built).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Parses `ID=BIAS` pairs.
pub fn parse_logit_bias(items: &[String]) -> Result<Vec<(u32, f64)>> {
    let mut out = Vec::new();
    for item in items {
        let Some((id, bias)) = item.split_once('=') else {
            bail!("--logit-bias takes ID=BIAS (such as 42=-1.5), got {item:?}");
        };
        let Ok(id) = id.trim().parse::<u32>() else {
            bail!("--logit-bias: {:?} is not a token id (a number >= 0) in {item:?}", id.trim());
        };
        let bias: f64 = match bias.trim().parse() {
            Ok(b) if !f64::is_nan(b) => b,
            _ => bail!("--logit-bias: {:?} is not a number in {item:?}", bias.trim()),
        };
        out.push((id, bias));
    }
    Ok(out)
}

impl SamplingArgs {
    /// The validated sampler settings (XTC's special tokens are added by [`Self::for_model`]).
    pub fn sampler_config(&self) -> Result<SamplerConfig> {
        let config = SamplerConfig {
            temp: self.temp,
            top_p: self.top_p,
            min_p: self.min_p,
            min_tokens_to_keep: self.min_tokens_to_keep,
            top_k: self.top_k,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            xtc_special_tokens: Vec::new(),
            processors: LogitsProcessors {
                logit_bias: parse_logit_bias(&self.logit_bias)?,
                repetition_penalty: self.repetition_penalty,
                repetition_context_size: self.repetition_context_size,
                presence_penalty: self.presence_penalty,
                presence_context_size: self.presence_context_size,
                frequency_penalty: self.frequency_penalty,
                frequency_context_size: self.frequency_context_size,
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// Completes `config` for the loaded model as mlx_lm.generate does (XTC's special tokens:
    /// `encode("\n")` and the EOS ids), checks the vocabulary-bound values, and seeds MLX's key.
    pub fn for_model(&self, config: SamplerConfig, loaded: &LoadedModel) -> Result<SamplerConfig> {
        self.for_models(config, loaded, None)
    }

    /// [`Self::for_model`] with a draft model, which mlx_lm.generate loads after the model: its
    /// load draws from the seeded key too.
    pub fn for_models(&self, mut config: SamplerConfig, loaded: &LoadedModel, draft: Option<&LoadedModel>) -> Result<SamplerConfig> {
        config.xtc_special_tokens = engine::sample::xtc_special_tokens(loaded)?;
        config.validate_vocab(loaded.model.vocab_size())?;
        if let Some(seed) = self.seed {
            engine::sample::seed_as_mlx_lm(seed, loaded)?;
            if let Some(d) = draft {
                for _ in 0..engine::sample::init_random_draws(&d.path, &d.config)? {
                    drop(mlx::random::uniform(&[], mlx::Dtype::F32)?);
                }
            }
        }
        Ok(config)
    }
}

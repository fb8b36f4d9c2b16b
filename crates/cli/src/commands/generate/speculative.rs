//! The speculative decoding flags of `generate`, `bench` and `serve` (`--draft-model`, `--prompt-lookup`, `--num-draft-tokens`, `--adaptive-draft`, `--always-speculate`) and `generate`'s token stream that is plain or speculative.
use anyhow::{bail, Result};
use engine::cache::KvCache;
use engine::models::Model;
use engine::{Draft, GenerateConfig, Generated, Generator, LoadedModel, SpecStats, SpeculativeConfig, SpeculativeGenerator};
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: a smaller model with the same tokenizer drafts tokens that the model
    /// verifies in one pass (same output, as mlx-lm's).
    #[arg(long, conflicts_with = "prompt_lookup")]
    pub draft_model: Option<PathBuf>,
    /// Tokens drafted per round with --draft-model or --prompt-lookup [default: 3 (mlx-lm's); 8 for
    /// --prompt-lookup on a GPU, where a round costs about the same at K=4 and K=8]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub num_draft_tokens: Option<u32>,
    /// Speculative decoding without a draft model: propose the continuation of the latest earlier
    /// match of the last N-gram (N down to 1) in the prompt and the text so far.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_lookup: Option<u32>,
    /// Adapt the draft length to the acceptance (+2 after a fully accepted round, -1 after a
    /// rejection, within 1..=4x --num-draft-tokens).
    #[arg(long)]
    pub adaptive_draft: bool,
    /// Speculate every round. Without it, greedy runs (no penalties or logit bias) decode plainly
    /// while speculation is measured to be slower, with the same tokens.
    #[arg(long)]
    pub always_speculate: bool,
}

impl SpecArgs {
    pub fn enabled(&self) -> bool {
        self.draft_model.is_some() || self.prompt_lookup.is_some()
    }

    /// Loads `--draft-model` and checks that its vocabulary is the model's.
    pub fn load_draft(&self, target: &LoadedModel) -> Result<Option<LoadedModel>> {
        let Some(path) = &self.draft_model else { return Ok(None) };
        let dir = crate::model_arg::resolve(Some(path))?;
        let (draft, _) = crate::progress::load_model(&dir)?;
        check_vocab(target, &draft, &dir)?;
        Ok(Some(draft))
    }

    /// Draft tokens per round: `--num-draft-tokens`, else 3 (mlx-lm's default), and 8 for prompt
    /// lookup on the GPU: there a round's cost hardly grows with its positions (a Llama-3.2-3B
    /// shape's round 8.9 ms at K=4, 9.4 at K=8 on an H100), so a matched continuation pays more the
    /// longer it is (1.61x plain at K=4, 2.43-2.61x at K=8; BENCHMARKS.md), and the fallback
    /// covers the prompts where little matches.
    pub fn draft_tokens(&self) -> usize {
        // --draft-model and --prompt-lookup conflict (clap).
        let gpu_lookup = self.prompt_lookup.is_some() && mlx::runtime::default_device() == mlx::runtime::Device::Gpu;
        self.num_draft_tokens.map_or(if gpu_lookup { 8 } else { 3 }, |k| k as usize)
    }

    /// The rounds' settings: the flags', and the device's verification padding and pipelining.
    pub fn config(&self) -> Result<SpeculativeConfig> {
        Ok(SpeculativeConfig {
            num_draft_tokens: self.draft_tokens(),
            adaptive: self.adaptive_draft,
            fallback: !self.always_speculate,
            pad_verify: verify_padding()?,
            pipeline: pipelined_rounds()?,
        })
    }

    /// The token stream: speculative with a draft model or prompt lookup, else plain.
    pub fn stream<'m>(
        &self,
        model: &'m dyn Model,
        draft: Option<&'m LoadedModel>,
        prompt: &[u32],
        cache: Vec<Box<dyn KvCache>>,
        config: GenerateConfig,
        constraint: Option<Box<dyn engine::sample::TokenConstraint>>,
    ) -> Result<Tokens<'m>> {
        let spec = self.config()?;
        let drafter = match (draft, self.prompt_lookup) {
            (Some(d), _) => Draft::Model { model: d.model.as_ref(), cache: d.model.make_cache() },
            (None, Some(n)) => Draft::PromptLookup { ngram: n as usize },
            (None, None) => return Ok(Tokens::Plain(Box::new(Generator::new_constrained(model, prompt, cache, config, constraint)?))),
        };
        Ok(Tokens::Spec(Box::new(SpeculativeGenerator::new_constrained(model, prompt, cache, drafter, config, spec, constraint)?)))
    }
}

/// Whether rounds are pipelined (prompt lookup: each round queued before the one in flight is read;
/// a draft model: the next round's first draft step queued while the verification runs): on the
/// GPU, where decoding is host-bound and it pays (prompt lookup on an H200: 2.87x plain against
/// 2.62x on the Qwen3-0.6B shape, 2.03x against 1.58x on Llama-3.2-3B; Llama-3.2-3B drafting for
/// itself on an H100: 22.7 / 24.9 ms a round against 25.9 / 28.6), not on the CPU, where the device
/// has no idle time for the bet to fill and it loses (BENCHMARKS.md); `MLX_GEN_SPEC_PIPELINE=0|1` sets it.
fn pipelined_rounds() -> Result<bool> {
    match std::env::var("MLX_GEN_SPEC_PIPELINE").as_deref() {
        Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(v) => Err(anyhow::anyhow!("MLX_GEN_SPEC_PIPELINE={v:?} is neither 0 nor 1")),
        Err(_) => Ok(mlx::runtime::default_device() == mlx::runtime::Device::Gpu),
    }
}

/// What the verification pass is padded to: 8 positions on the GPU (MLX's CUDA quantized matrix
/// product is much slower for 2-7 rows than for 8), none on the CPU; `MLX_GEN_VERIFY_PAD=N` sets it.
fn verify_padding() -> Result<usize> {
    match std::env::var("MLX_GEN_VERIFY_PAD") {
        Ok(v) => v.trim().parse::<usize>().map_err(|_| anyhow::anyhow!("MLX_GEN_VERIFY_PAD={v:?} is not a whole number")),
        Err(_) => Ok(if mlx::runtime::default_device() == mlx::runtime::Device::Gpu { 8 } else { 1 }),
    }
}

/// The draft must tokenize as the model does: same vocabulary size (mlx-lm's check) and tokens.
fn check_vocab(target: &LoadedModel, draft: &LoadedModel, dir: &std::path::Path) -> Result<()> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    if t.vocab_size() != d.vocab_size() {
        bail!(
            "the draft model {} has a vocabulary of {} tokens, the model {}: speculative decoding needs the same tokenizer",
            dir.display(),
            d.vocab_size(),
            t.vocab_size()
        );
    }
    if let Some(id) = (0..t.vocab_size() as u32).find(|&id| t.id_to_token(id) != d.id_to_token(id)) {
        bail!(
            "the draft model {} has another vocabulary (token {id} is {:?}, the model's is {:?}): speculative decoding needs the same tokenizer",
            dir.display(),
            d.id_to_token(id).unwrap_or_default(),
            t.id_to_token(id).unwrap_or_default()
        );
    }
    Ok(())
}

/// Plain or speculative generation, yielding (token, whether it is an accepted draft token).
pub enum Tokens<'m> {
    Plain(Box<Generator<'m>>),
    Spec(Box<SpeculativeGenerator<'m>>),
}

impl Tokens<'_> {
    /// Whether the caller reads the log-probabilities (plain decoding under a constraint queues
    /// each step in one evaluation only where it does not: see [`Generator::set_logprobs_read`]).
    pub fn set_logprobs_read(&mut self, read: bool) {
        if let Tokens::Plain(g) = self {
            g.set_logprobs_read(read);
        }
    }

    /// Why the grammar ended generation early, if it did.
    pub fn constraint_note(&self) -> Option<String> {
        match self {
            Tokens::Plain(g) => g.constraint_note(),
            Tokens::Spec(s) => s.constraint_note(),
        }
    }

    /// Draft statistics (speculative decoding only).
    pub fn stats(&self) -> Option<SpecStats> {
        match self {
            Tokens::Plain(_) => None,
            Tokens::Spec(s) => Some(s.stats()),
        }
    }
}

impl Iterator for Tokens<'_> {
    type Item = engine::Result<(Generated, bool)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Tokens::Plain(g) => g.next().map(|r| r.map(|g| (g, false))),
            Tokens::Spec(s) => s.next().map(|r| r.map(|t| (Generated { token: t.token, logprobs: t.logprobs }, t.from_draft))),
        }
    }
}

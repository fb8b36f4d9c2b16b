//! `mlx-gen cache-prompt`: prefill a prompt and save its KV cache to a file in mlx-lm's
//! `save_prompt_cache` format (as `mlx_lm.cache_prompt`); also the KV cache flags that `generate`
//! and `bench` share.
use anyhow::{bail, Context, Result};
use engine::cache::{self, KvCache, KvQuantConfig, PagedPool, DEFAULT_QUANTIZED_KV_START};
use tokenizer::ChatMessage;
use engine::{GenerateConfig, Generator, LoadedModel};
use std::io::Read;
use std::path::PathBuf;

/// The KV cache flags of mlx-lm's generate and cache_prompt.
#[derive(clap::Args, Clone)]
pub struct KvArgs {
    /// Keep at most this many positions in the KV cache: a rotating cache keeps the first 4 and the latest
    /// (as mlx-lm, not for models that make their own caches, e.g. llama).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub max_kv_size: Option<i32>,
    /// Quantize the KV cache to this many bits (4 or 8 typically).
    #[arg(long)]
    pub kv_bits: Option<i32>,
    /// Group size of the KV cache quantization.
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: i32,
    /// With --kv-bits: start quantizing once the cache holds this many positions.
    #[arg(long, default_value_t = DEFAULT_QUANTIZED_KV_START)]
    pub quantized_kv_start: usize,
}

impl KvArgs {
    pub fn quant(&self) -> Result<Option<KvQuantConfig>> {
        let q = self.kv_bits.map(|bits| KvQuantConfig { bits, group_size: self.kv_group_size, start: self.quantized_kv_start });
        if let Some(q) = &q {
            q.validate()?;
        }
        Ok(q)
    }
}

/// Which KV cache implementation holds the sequence.
#[derive(Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvCacheKind {
    /// The model's own caches (growing, or rotating with --max-kv-size), as mlx-lm.
    #[default]
    Growing,
    /// Blocks of positions from a pool; a rotating window (--max-kv-size, sliding-window layers)
    /// is a ring of blocks. Same tokens as the model's caches.
    Paged,
}

/// Positions per block of the paged cache by default.
pub const DEFAULT_BLOCK_SIZE: usize = 256;

/// A fresh cache for `prompt`: the model's (mlx-lm's make_prompt_cache), or a paged one.
pub fn make_cache(loaded: &LoadedModel, kv: &KvArgs, kind: KvCacheKind) -> Result<Vec<Box<dyn KvCache>>> {
    make_cache_with(loaded, kv, kind, DEFAULT_BLOCK_SIZE)
}

/// [`make_cache`] with paged blocks of `block_size` positions. The paged cache mirrors the
/// model's caches layer by layer: where it would use a rotating cache (`--max-kv-size`, or a
/// sliding-window layer), the layer gets a ring of blocks with the same window.
pub fn make_cache_with(loaded: &LoadedModel, kv: &KvArgs, kind: KvCacheKind, block_size: usize) -> Result<Vec<Box<dyn KvCache>>> {
    let caches = loaded.model.make_prompt_cache(kv.max_kv_size);
    match kind {
        KvCacheKind::Growing => Ok(caches),
        KvCacheKind::Paged => {
            if kv.kv_bits.is_some() {
                bail!("--kv-cache paged does not combine with --kv-bits (the paged cache is not quantized)");
            }
            if block_size == 0 {
                bail!("--kv-block-size must be at least 1");
            }
            let windows: Vec<Option<(i32, i32)>> = caches.iter().map(|c| c.window()).collect();
            let pool = PagedPool::new(windows.len(), block_size, 64 << 30);
            let paged = pool.new_windowed_sequence(&[], &windows)?.0;
            // A recurrent layer keeps its state (it has no positions to page).
            Ok(caches.into_iter().zip(paged).map(|(c, p)| if c.as_arrays().is_some() { c } else { p }).collect())
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt to cache; `-` reads it from standard input.
    #[arg(short, long)]
    prompt: String,
    /// The file to save the prompt cache in (.safetensors).
    #[arg(long)]
    prompt_cache_file: PathBuf,
    #[command(flatten)]
    kv: KvArgs,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
}

/// Renders `messages` with the last one left open, as transformers' `continue_final_message`.
pub fn continue_final_message(loaded: &LoadedModel, messages: &[ChatMessage]) -> Result<String> {
    let rendered = loaded.tokenizer.apply_chat_template(messages, false)?;
    let last = messages.last().map(|m| m.content.as_str()).unwrap_or("");
    let Some(loc) = rendered.rfind(last.trim()) else {
        bail!("the chat template does not contain the final message; it cannot be continued");
    };
    let lstripped = last.trim_start();
    let end = if rendered[loc..].starts_with(lstripped) && lstripped == last { loc + lstripped.len() } else { loc + last.trim().len() };
    Ok(rendered[..end].to_owned())
}

pub fn run(args: Args) -> Result<()> {
    let text = if args.prompt == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("cannot read the prompt from standard input")?;
        s
    } else {
        args.prompt.clone()
    };
    let model_dir = crate::model_arg::resolve(args.model.as_deref())?;
    let (loaded, _) = crate::progress::load_model(&model_dir)?;
    let tok = &loaded.tokenizer;
    let ids = if tok.has_chat_template() {
        let rendered = continue_final_message(&loaded, &[ChatMessage::new("user", text)])?;
        tok.encode(&rendered, false)?
    } else {
        tok.encode(&text, true)?
    };
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    // As generate_step with max_tokens=0: prefill up to the last token, then one step over it.
    let config = GenerateConfig {
        max_tokens: Some(0),
        prefill_step_size: args.prefill_step_size,
        kv_quant: args.kv.quant()?,
        ..GenerateConfig::default()
    };
    let cache = loaded.model.make_prompt_cache(args.kv.max_kv_size);
    let generator = Generator::new(loaded.model.as_ref(), &ids, cache, config)?;
    let cache = generator.into_cache();
    let state: Vec<mlx::Array> = cache.iter().flat_map(|c| c.state()).collect();
    mlx::eval(&state.iter().collect::<Vec<_>>())?;
    let model_name = args.model.as_ref().map_or_else(|| model_dir.display().to_string(), |m| m.display().to_string());
    let metadata = vec![("model".to_owned(), model_name), ("tokenizer_config".to_owned(), "{\"trust_remote_code\": false}".to_owned())];
    cache::save_prompt_cache(&args.prompt_cache_file, &cache, &metadata)
        .with_context(|| format!("cannot write {}", args.prompt_cache_file.display()))?;
    if crate::progress::enabled() {
        eprintln!("Saved the cache of {} prompt tokens to {}", ids.len(), args.prompt_cache_file.display());
    }
    Ok(())
}

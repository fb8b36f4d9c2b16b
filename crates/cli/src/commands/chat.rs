//! `mlx-gen chat`: a multi-turn terminal chat; earlier turns stay in the KV cache so each turn prefills only its new tokens.
//! On several ranks (`mlx-gen launch -- chat`), rank 0 reads and prints; it hands every input to the
//! other ranks, which run the same turns and commands silently.
mod input;
mod render;
mod session;

use super::sampling::SamplingArgs;
use anyhow::{bail, Context, Result};
use engine::{GenerateConfig, Generator, LoadedModel};
use input::{Input, KeepOutputOnInterrupt, Reader};
use render::Renderer;
use session::Session;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Maximum number of tokens per answer.
    #[arg(short = 'm', long, default_value_t = 512)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A system message placed first in the conversation (`/system TEXT` changes it).
    #[arg(long)]
    system_prompt: Option<String>,
    /// Keep at most this many positions in the KV cache: the oldest turns are dropped (and the rest prefilled again)
    /// to make room, and answers are cut to fit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(16..))]
    max_kv_size: Option<u32>,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    prefill_step_size: u32,
    /// Do not show `<think>…</think>` reasoning.
    #[arg(long)]
    hide_reasoning: bool,
    /// After each answer: prompt tokens processed (and reused from the cache), tok/s, peak memory.
    #[arg(long)]
    verbose: bool,
    /// On several ranks (mlx-gen launch): pipeline parallel instead of tensor parallel.
    #[arg(long)]
    pipeline: bool,
}

const HELP: &str = "\
Commands:
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (empty: remove it)
  /save FILE     write the conversation as JSON
  /help          this help
  /exit          leave (also Ctrl-D; Ctrl-C stops an answer, at the prompt it leaves)
A line ending in \\ continues on the next line; \"\"\" opens and closes a multi-line block.";

/// Set by Ctrl-C during an answer; the answer stops at the next token.
static STOP: AtomicBool = AtomicBool::new(false);
/// An answer is being generated (Ctrl-C stops it rather than leaving).
static GENERATING: AtomicBool = AtomicBool::new(false);

fn install_ctrl_c() -> Result<()> {
    // On several ranks an answer cannot stop early: the others would not know at which token.
    let sharded = crate::rank::group().is_some();
    ctrlc::set_handler(move || {
        if !sharded && GENERATING.load(Ordering::SeqCst) && !STOP.swap(true, Ordering::SeqCst) {
            return;
        }
        // A second Ctrl-C, or one while waiting for plain (non-terminal) input: leave.
        input::restore_terminal();
        let mut out = std::io::stdout();
        let _ = write!(out, "\x1b[0m");
        let _ = out.flush();
        std::process::exit(130);
    })
    .context("cannot install the Ctrl-C handler")
}

pub fn run(args: Args) -> Result<()> {
    let sampler = args.sampling.sampler_config()?;
    let model_dir = crate::model_arg::resolve(args.model.as_deref())?;
    let (loaded, load_s) = crate::rank::load_model(&model_dir, args.pipeline)?;
    if !loaded.tokenizer.has_chat_template() {
        bail!(
            "{} has no chat template: chat needs one (use `mlx-gen generate --ignore-chat-template` for raw text)",
            model_dir.display()
        );
    }
    let sampler = args.sampling.for_model(sampler, &loaded)?;
    let leader = crate::rank::is_leader();
    // Only rank 0 reads standard input.
    let mut reader = if leader { Some(Reader::new()?) } else { None };
    let ansi = leader && std::io::stdout().is_terminal();
    install_ctrl_c()?;
    if reader.as_ref().is_some_and(Reader::interactive) {
        eprintln!("Loaded {} in {load_s:.2}s. Type /help for commands, Ctrl-D to leave.", model_dir.display());
    }
    let mut session = Session::new(&loaded, args.system_prompt.clone(), args.max_kv_size.map(|n| n as usize));
    loop {
        let text = match shared_input(reader.as_mut())? {
            Input::Message(t) => t,
            Input::Interrupted | Input::Eof => break,
        };
        let mut out: Box<dyn Write> = if leader { Box::new(std::io::stdout().lock()) } else { Box::new(std::io::sink()) };
        if let Some(cmd) = text.trim_start().strip_prefix('/') {
            if !command(cmd.trim(), &mut session, &loaded, &mut out)? {
                break;
            }
            continue;
        }
        turn(&args, sampler.clone(), &loaded, &mut session, text, ansi, &mut out)?;
    }
    Ok(())
}

/// The next input: read by rank 0 (`reader`), and handed to the other ranks.
fn shared_input(reader: Option<&mut Reader>) -> Result<Input> {
    let mine = match reader {
        Some(r) => match r.read()? {
            Input::Message(t) => format!("M{t}"),
            Input::Interrupted => "I".to_owned(),
            Input::Eof => "E".to_owned(),
        },
        None => String::new(),
    };
    let shared = String::from_utf8(crate::rank::share_from_leader(mine.as_bytes())?).context("rank 0 sent text that is not UTF-8")?;
    Ok(match shared.split_at_checked(1) {
        Some(("M", t)) => Input::Message(t.to_owned()),
        Some(("I", _)) => Input::Interrupted,
        _ => Input::Eof,
    })
}

/// Runs a slash command, its replies to `out`; false to leave.
fn command(cmd: &str, session: &mut Session, loaded: &LoadedModel, out: &mut dyn Write) -> Result<bool> {
    let (name, rest) = cmd.split_once(char::is_whitespace).map_or((cmd, ""), |(n, r)| (n, r.trim()));
    match name {
        "exit" | "quit" | "bye" => return Ok(false),
        "help" | "?" => writeln!(out, "{HELP}")?,
        "reset" | "clear" => {
            session.reset(loaded);
            writeln!(out, "Conversation reset.")?;
        }
        "system" => {
            session.system = (!rest.is_empty()).then(|| rest.to_owned());
            writeln!(out, "{}", if rest.is_empty() { "System prompt removed." } else { "System prompt set." })?;
        }
        "save" if rest.is_empty() => writeln!(out, "Usage: /save FILE")?,
        // On several ranks only rank 0 writes the file.
        "save" if !crate::rank::is_leader() => {}
        "save" => {
            let json = serde_json::to_string_pretty(&serde_json::json!({ "messages": session.conversation() }))?;
            match std::fs::write(rest, json + "\n") {
                Ok(()) => writeln!(out, "Saved {} messages to {rest}.", session.conversation().len())?,
                Err(e) => writeln!(out, "Cannot write {rest}: {e}")?,
            }
        }
        _ => writeln!(out, "Unknown command /{name}: type /help for the list.")?,
    }
    out.flush()?;
    Ok(true)
}

/// Prefills `head` but its last id (the prompt up to position `at`) into the session's cache and keeps the
/// recurrent layers' states there; returns the cache (the generator goes on from `at`).
fn prefill_to_snapshot(
    loaded: &LoadedModel,
    session: &mut Session,
    head: &[u32],
    at: usize,
    step: usize,
) -> engine::Result<Vec<Box<dyn engine::cache::KvCache>>> {
    let mut cache = session.take_cache();
    let ids: Vec<i32> = head.iter().map(|&t| t as i32).collect();
    let prompt = mlx::Array::from_slice(&ids, &[1, ids.len() as i32])?;
    engine::prefill::prefill(loaded.model.as_ref(), &mut cache, &prompt, step, None, |_| Ok(()))?;
    session.keep_snapshot(at, &cache);
    Ok(cache)
}

/// One exchange: prefill the new tokens, stream the answer until EOS, the token limit or Ctrl-C.
fn turn(
    args: &Args,
    sampler: engine::SamplerConfig,
    loaded: &LoadedModel,
    session: &mut Session,
    text: String,
    ansi: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let leader = crate::rank::is_leader();
    let prep = match session.prepare(loaded, text, args.max_tokens) {
        Ok(p) => p,
        Err(e) => {
            if leader {
                eprintln!("error: {e:#}");
            }
            return Ok(());
        }
    };
    if prep.dropped > 0 && args.verbose && leader {
        eprintln!("[--max-kv-size: dropped the {} oldest messages]", prep.dropped);
    }
    let config = GenerateConfig {
        max_tokens: Some(prep.max_tokens),
        prefill_step_size: args.prefill_step_size as usize,
        sampler,
        kv_quant: None,
    };
    mlx::runtime::reset_peak_memory();
    STOP.store(false, Ordering::SeqCst);
    let _keep = KeepOutputOnInterrupt::new();
    GENERATING.store(true, Ordering::SeqCst);
    let mut renderer = Renderer::new(ansi, args.hide_reasoning);
    renderer.begin(out, prep.starts_thinking)?;
    let tic = Instant::now();
    let new_ids = &prep.ids[prep.reused..];
    let mut handed = Vec::new();
    let mut detok = loaded.tokenizer.detokenizer();
    let (mut prompt_s, mut gen_start) = (0.0, tic);
    crate::rank::heartbeat("prefill");
    let started = match prep.snapshot_at {
        Some(at) => prefill_to_snapshot(loaded, session, &prep.ids[prep.reused..=at], at, config.prefill_step_size).map(|c| (c, &prep.ids[at..])),
        None => Ok((session.take_cache(), new_ids)),
    };
    let mut generator = match started.and_then(|(cache, rest)| Generator::new(loaded.model.as_ref(), rest, cache, config)) {
        Ok(g) => g,
        Err(e) => {
            GENERATING.store(false, Ordering::SeqCst);
            session.reset(loaded);
            return Err(e).context("cannot process the prompt (the conversation was reset)");
        }
    };
    let mut failure = None;
    while !STOP.load(Ordering::SeqCst) {
        let Some(step) = generator.next() else { break };
        crate::rank::heartbeat("generation step");
        let step = match step {
            Ok(s) => s,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        if handed.is_empty() {
            prompt_s = tic.elapsed().as_secs_f64();
            gen_start = Instant::now();
        }
        handed.push(step.token);
        if loaded.is_eos(step.token) {
            break;
        }
        detok.add_token(step.token);
        renderer.push(out, &detok.last_segment())?;
        out.flush()?;
    }
    crate::rank::finished();
    let stopped = STOP.load(Ordering::SeqCst);
    GENERATING.store(false, Ordering::SeqCst);
    detok.finalize();
    renderer.push(out, &detok.last_segment())?;
    renderer.finish(out)?;
    writeln!(out)?;
    if stopped {
        writeln!(out, "[stopped]")?;
    }
    out.flush()?;
    let gen_s = gen_start.elapsed().as_secs_f64();
    session.restore(generator.into_cache(), &prep.ids, &handed);
    if let Some(e) = failure {
        session.reset(loaded);
        return Err(e).context("generation failed (the conversation was reset)");
    }
    session.answer(detok.text().to_owned());
    if args.verbose && leader {
        let n = handed.len();
        eprintln!(
            "[prompt: {} tokens processed, {} reused from the cache, {:.3} tokens-per-sec | generation: {n} tokens, {:.3} tokens-per-sec | peak memory: {:.3} GB]",
            new_ids.len(),
            prep.reused,
            new_ids.len() as f64 / prompt_s.max(1e-9),
            if n > 0 { n as f64 / gen_s.max(1e-9) } else { 0.0 },
            mlx::runtime::peak_memory() as f64 / 1e9
        );
    }
    Ok(())
}

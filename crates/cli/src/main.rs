//! `mlx-gen`: generate text with LLMs on Apple's MLX, natively. Parses the command line, picks the
//! device, runs one command, and turns any error into one line on stderr and exit code 1.
mod commands;
mod model_arg;
mod completions;
mod progress;
mod rank;

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "mlx-gen", about = "Native LLM inference on Apple's MLX", disable_version_flag = true)]
struct Cli {
    /// Print the version, the MLX version and the device that would be used.
    #[arg(short = 'V', long, global = true)]
    version: bool,
    /// Device to run on (default: the GPU when MLX has one, else the CPU).
    #[arg(long, global = true, value_enum)]
    device: Option<DeviceArg>,
    /// No progress bars or status lines on stderr (they are also hidden when stderr is not a terminal).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Cpu,
    Gpu,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (flags as mlx_lm.generate).
    Generate(Box<commands::generate::Args>),
    /// Prefill a prompt and save its KV cache for `generate --prompt-cache-file` (as mlx_lm.cache_prompt).
    CachePrompt(commands::cache_prompt::Args),
    /// Chat with a model in the terminal, turn after turn (as mlx_lm.chat).
    Chat(commands::chat::Args),
    /// Measure prompt and generation speed (as mlx_lm.benchmark).
    Bench(commands::bench::Args),
    /// Serve a model over an OpenAI-compatible HTTP API (as mlx_lm.server).
    Serve(commands::serve::Args),
    /// Convert a Hugging Face model (folder or repo id) or a GGUF file to an MLX model folder (as mlx_lm.convert).
    Convert(commands::convert::Args),
    /// Prepare an outpainting canvas: the image padded (pixels kept bit-exact), a binary mask, optionally a feathered one.
    OutpaintPrep(commands::outpaint_prep::Args),
    /// Print the flow-matching Euler schedule (SD3/FLUX sigmas and timesteps), e.g. `--steps 28 --shift 3 --json`.
    FlowSchedule(commands::flow_schedule::Args),
    /// Run generate, chat, bench or serve on several ranks with MLX distributed (tensor parallel, or
    /// pipeline parallel with the command's --pipeline), e.g.
    /// `launch --hosts 127.0.0.1,127.0.0.1 -- generate --model M`.
    Launch(commands::launch::Args),
    /// Print a shell completion script: `mlx-gen completions bash > /etc/bash_completion.d/mlx-gen`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `mlx-gen man > mlx-gen.1 && man ./mlx-gen.1`.
    Man,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(commands::convert::argv()) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind::*;
            if matches!(e.kind(), DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand) {
                e.exit();
            }
            eprintln!("{}", one_line(&e));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            // One write for the whole line: ranks of `launch` share one stderr, and a line written
            // in pieces (as `eprintln!` does) can interleave with another rank's.
            let line = format!("error: {msg}{}\n", hint(&msg));
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    use clap::CommandFactory;
    progress::set_quiet(cli.quiet);
    // Commands that need no device: no MLX initialisation on their path.
    match &cli.command {
        Some(Command::Completions { shell }) if !cli.version => return completions::completions(*shell, &mut Cli::command()),
        Some(Command::Man) if !cli.version => return completions::man(Cli::command()),
        Some(Command::OutpaintPrep(args)) if !cli.version => return commands::outpaint_prep::run(args),
        Some(Command::FlowSchedule(args)) if !cli.version => return commands::flow_schedule::run(args),
        Some(Command::Launch(args)) if !cli.version => return commands::launch::run(args),
        None if !cli.version => {
            Cli::command().print_help()?;
            return Ok(());
        }
        _ => {}
    }
    let device = match cli.device {
        Some(DeviceArg::Cpu) => mlx::runtime::Device::Cpu,
        Some(DeviceArg::Gpu) => mlx::runtime::Device::Gpu,
        None if mlx::runtime::gpu_available() => mlx::runtime::Device::Gpu,
        None => mlx::runtime::Device::Cpu,
    };
    if cli.version {
        println!("{}", version_line(device));
        return Ok(());
    }
    mlx::runtime::set_default_device(device)?;
    // As mlx-lm's generation_stream: a stream of our own (measurably faster on CUDA than the default).
    mlx::runtime::use_new_stream()?;
    // On the GPU, fuse q/k/v and gate/up projections (fewer kernels per token); the CPU keeps
    // mlx-lm's exact shapes so that its results stay bit-identical. MLX_GEN_NO_FUSE=1 turns it off,
    // MLX_GEN_FUSE=1 turns it on anywhere.
    let fuse = (device == mlx::runtime::Device::Gpu && std::env::var_os("MLX_GEN_NO_FUSE").is_none())
        || std::env::var_os("MLX_GEN_FUSE").is_some();
    engine::nn::set_fused_projections(fuse);
    if device == mlx::runtime::Device::Gpu {
        // A few query positions at once (speculative verification) use composed attention: MLX's
        // CUDA backend builds a cuDNN graph per new shape (see engine::nn::sdpa).
        engine::nn::sdpa::set_composed_max(32);
        // MLX's CUDA backend commits a CUDA graph every MLX_MAX_OPS_PER_BUFFER operations (20 by
        // default); 80 measured fastest for our decode step on the H200 (BENCHMARKS.md). A value
        // the user sets wins. (Metal reads the same variable with other defaults: left alone.)
        if cfg!(target_os = "linux") {
            mlx::runtime::set_env_default("MLX_MAX_OPS_PER_BUFFER", "80")?;
            // A long prefill chunk queues at most 2 layers ahead of the device (engine::prefill):
            // on the H100, 0.41-0.62x the prefill peak and 6-15% faster prefill, decode unchanged;
            // the server at 1/8/32 streams as fast or faster with it, first tokens sooner
            // (BENCHMARKS.md, 2026-12-06 second lease).
            engine::prefill::set_default_lookahead(2);
        }
    }
    if device == mlx::runtime::Device::Cpu && matches!(cli.command, Some(Command::Chat(_) | Command::Serve(_))) {
        settle_cpu_compiler()?;
    }
    // A rank started by `mlx-gen launch` (or by hand with MLX_GEN_DISTRIBUTED) joins its group.
    rank::join_from_env(matches!(cli.command, Some(Command::Generate(_) | Command::Chat(_) | Command::Bench(_) | Command::Serve(_))))?;
    let result = match cli.command {
        Some(Command::Generate(args)) => commands::generate::run(*args),
        Some(Command::Chat(args)) => commands::chat::run(args),
        Some(Command::CachePrompt(args)) => commands::cache_prompt::run(args),
        Some(Command::Bench(args)) => commands::bench::run(args, &version_line(device)),
        Some(Command::Serve(args)) => commands::serve::run(args),
        Some(Command::Convert(args)) => commands::convert::run(args),
        Some(Command::Completions { .. } | Command::Man | Command::OutpaintPrep(_) | Command::FlowSchedule(_) | Command::Launch(_)) | None => Ok(()),
    };
    // Let work queued ahead (the decode step after the last token) finish before the process and
    // MLX's globals are torn down.
    let _ = mlx::runtime::synchronize();
    result
}

/// clap's usage error as one line: the error, its tip, and which `--help` to read.
fn one_line(e: &clap::Error) -> String {
    use clap::CommandFactory;
    let text = e.render().to_string();
    let cmd = Cli::command();
    let sub = std::env::args().skip(1).find(|a| cmd.get_subcommands().any(|s| s.get_name() == a));
    let help = match sub {
        Some(s) => format!("mlx-gen {s} --help"),
        None => "mlx-gen --help".to_owned(),
    };
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage: ") && !l.starts_with("For more information"))
        .collect();
    format!("{} (see `{help}`)", parts.join("; "))
}

/// What to do about errors whose cause a person cannot guess from MLX's own words.
fn hint(msg: &str) -> &'static str {
    let lower = msg.to_lowercase();
    if lower.contains("out of memory") || lower.contains("unable to allocate") || lower.contains("memory limit") {
        " (out of memory: try a smaller or more quantized model, a shorter prompt, or --max-kv-size / --kv-bits)"
    } else {
        ""
    }
}

fn version_line(device: mlx::runtime::Device) -> String {
    let dev = match device {
        mlx::runtime::Device::Cpu => "cpu".to_owned(),
        mlx::runtime::Device::Gpu if mlx::runtime::gpu_available() => {
            let name = mlx::runtime::set_default_device(device).and_then(|_| mlx::runtime::device_name());
            format!("gpu ({})", name.unwrap_or_else(|_| "unknown".into()))
        }
        mlx::runtime::Device::Gpu => "gpu (not available)".to_owned(),
    };
    let blas = match mlx::runtime::build_blas() {
        b if b.starts_with("reference") || mlx::runtime::build_backend() != "cpu" => String::new(),
        b => format!(", BLAS {b}"),
    };
    format!(
        "mlx-gen {} (MLX {}, {} backend{blas}, device {dev})",
        env!("CARGO_PKG_VERSION"),
        mlx::runtime::mlx_version(),
        mlx::runtime::build_backend()
    )
}

/// MLX's CPU backend runs `system("g++ --version")` before its first compiled kernel, and glibc's
/// `system` ignores SIGINT while it runs and then puts back the handler it found. Done here, before
/// `chat` or `serve` install their Ctrl-C handlers (and before serve's engine thread starts its
/// first forward pass beside them), no Ctrl-C during a first answer is lost and no handler
/// installed meanwhile is undone. (One compiled kernel on one element: `silu(x) * x`.)
fn settle_cpu_compiler() -> anyhow::Result<()> {
    let x = mlx::Array::from_slice(&[1.0f32], &[1])?;
    mlx::fast::swiglu(&x, &x)?.eval()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::hint;

    #[test]
    fn out_of_memory_gets_advice() {
        assert!(hint("[malloc] Unable to allocate 123456 bytes").contains("out of memory"));
        assert!(hint("cudaMalloc failed: out of memory").contains("--kv-bits"));
        assert_eq!(hint("tensor x is missing"), "");
    }
}

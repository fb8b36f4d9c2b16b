//! `mlx-gen`: generate text with LLMs on Apple's MLX, natively. Parses the command line, picks the
//! device, runs one command, and turns any error into one line on stderr and exit code 1.
mod commands;

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
    Generate(commands::generate::Args),
    /// Measure prompt and generation speed (as mlx_lm.benchmark).
    Bench(commands::bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
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
    match cli.command {
        Some(Command::Generate(args)) => commands::generate::run(args),
        Some(Command::Bench(args)) => commands::bench::run(args, &version_line(device)),
        None => {
            use clap::CommandFactory;
            Cli::command().print_help()?;
            Ok(())
        }
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
    format!(
        "mlx-gen {} (MLX {}, {} backend, device {dev})",
        env!("CARGO_PKG_VERSION"),
        mlx::runtime::mlx_version(),
        mlx::runtime::build_backend()
    )
}

//! `summarizer-lab`: `bench`, `chaos`, and the `worker` they start as processes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use summarizer_lab::{bench, chaos};

#[derive(Debug, Parser)]
#[command(
    name = "summarizer-lab",
    version,
    about = "Benchmarks and fault runs for the summarizer worker"
)]
struct Cli {
    /// A TOML file with settings, under the same names as the environment variables.
    #[arg(long, global = true, env = "SUMMARIZER_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the no-op and compaction paths against bare NATS and Postgres.
    Bench(bench::BenchArgs),
    /// Run simulated agents against worker processes killed at random, then check that
    /// nothing was lost; exit 1 when an invariant broke.
    Chaos(chaos::ChaosArgs),
    /// `summarizer worker`, for the processes `bench` and `chaos` start.
    Worker,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    summarizer::cli::run_command(cli.config.as_deref(), |settings| async move {
        match cli.command {
            Command::Bench(args) => bench::run(&settings, &args).await?,
            Command::Chaos(args) => {
                if !chaos::run(&settings, &args).await? {
                    return Ok(ExitCode::FAILURE);
                }
            }
            Command::Worker => return summarizer::cli::worker(settings).await,
        }
        Ok(ExitCode::SUCCESS)
    })
}

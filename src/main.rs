//! The `summarizer` binary: everything lives in the library; see `summarizer --help`.

fn main() -> std::process::ExitCode {
    summarizer::cli::main()
}

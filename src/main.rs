//! The `ablate` binary: the command line of `src/cli/` over the `ablate` library.
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

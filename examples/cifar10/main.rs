//! `cargo run --release --example cifar10 -- [options]`: trains the reference
//! CNN on CIFAR-10 (`--data DIR` or `AETHER_CIFAR10`), or on a synthetic
//! stand-in made in code when there is no data. `--help` lists the options.
//! `tests/cifar10.rs` tests these modules.

mod args;
mod plot;
mod run;
#[path = "../shared/xdg.rs"]
mod xdg;

use std::process::ExitCode;

use args::{Cifar10Args, USAGE};
use run::run;

fn main() -> ExitCode {
    xdg::quiet_missing_runtime_dir();
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .map_err(|a| format!("argument {a:?} is not UTF-8"))
        })
        .collect();
    let args = match args.and_then(|a| Cifar10Args::parse(&a)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}\n\nRun with --help to see the options.");
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `cargo run --release --example cifar10 -- [options]`: trains the reference
//! CNN on CIFAR-10 (`--data DIR` or `AETHER_CIFAR10`), or on a synthetic
//! stand-in made in code when there is no data. `--help` lists the options.
//! All the work is in `aether::datasets::cifar10::run`, where tests reach it.

use std::process::ExitCode;

use aether::datasets::cifar10::{Cifar10Args, USAGE, run};

fn main() -> ExitCode {
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

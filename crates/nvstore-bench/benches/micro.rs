//! Standalone runner until `nvstore bench` is wired into the CLI:
//!
//! ```text
//! cargo bench -p nvstore-bench --bench micro -- compare --op insert --keys 1M --node-size 4K
//! cargo bench -p nvstore-bench --bench micro -- micro --engine all --op search --keys 1M
//! ```

use clap::{Parser, Subcommand};
use nvstore_bench::micro::{compare_main, micro_main, CompareArgs, MicroArgs};

#[derive(Parser)]
#[command(name = "micro", about = "nvstore micro-benchmarks and baseline comparison")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// One operation on one or more engines.
    Micro(MicroArgs),
    /// Every engine, interleaved repetitions, ratio to the tree.
    Compare(CompareArgs),
}

fn main() {
    // `cargo bench` appends `--bench`; ignore it.
    let args = std::env::args().filter(|a| a != "--bench");
    let cli = Cli::parse_from(args);
    let mut out = std::io::stdout().lock();
    let r = match &cli.cmd {
        Some(Cmd::Micro(a)) => micro_main(a, &mut out).map(|_| ()),
        Some(Cmd::Compare(a)) => compare_main(a, &mut out).map(|_| ()),
        // `cargo test --all-targets` runs benches with no arguments: nothing to do.
        None => {
            eprintln!("usage: cargo bench -p nvstore-bench --bench micro -- (micro|compare) [FLAGS]; --help for flags");
            Ok(())
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

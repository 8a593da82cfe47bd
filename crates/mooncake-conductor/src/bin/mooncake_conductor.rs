//! The Conductor KV indexer's process: a thin shell over `mooncake_conductor::main`.

fn main() {
    std::process::exit(mooncake_conductor::main(std::env::args().collect()));
}

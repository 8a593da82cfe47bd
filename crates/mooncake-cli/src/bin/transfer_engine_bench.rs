fn main() {
    std::process::exit(mooncake_cli::entry::run(
        "transfer_engine_bench",
        std::env::args().collect(),
    ))
}

fn main() {
    std::process::exit(mooncake_cli::entry::run(
        "mooncake_client",
        std::env::args().collect(),
    ))
}

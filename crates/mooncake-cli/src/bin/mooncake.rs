fn main() {
    std::process::exit(mooncake_cli::entry::run(
        "mooncake",
        std::env::args().collect(),
    ))
}

fn main() {
    std::process::exit(mooncake_cli::entry::run(
        "mooncake_master",
        std::env::args().collect(),
    ))
}

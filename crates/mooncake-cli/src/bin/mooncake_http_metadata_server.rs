fn main() {
    std::process::exit(mooncake_cli::entry::run(
        "mooncake_http_metadata_server",
        std::env::args().collect(),
    ))
}

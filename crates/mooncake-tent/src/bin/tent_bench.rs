//! `tent_bench`: a thin shell over `mooncake_tent::bench::run`.

fn main() {
    mooncake_common::logging::init("warn");
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = mooncake_tent::bench::parse_args(&argv)
        .and_then(|args| mooncake_tent::bench::run(&args, &mut std::io::stdout()));
    if let Err(e) = result {
        eprintln!("tent_bench: {e}");
        std::process::exit(1);
    }
}

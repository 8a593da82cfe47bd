//! `tebench`: a thin shell over `mooncake_tent::tebench::run`.

fn main() {
    mooncake_common::logging::init("warn");
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = mooncake_tent::tebench::parse(&argv)
        .and_then(|flags| mooncake_tent::tebench::run(&flags, &mut std::io::stdout()));
    if let Err(e) = result {
        eprintln!("tebench: {e}");
        std::process::exit(1);
    }
}

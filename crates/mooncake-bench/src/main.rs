fn main() {
    std::process::exit(mooncake_bench::main(std::env::args().collect()))
}

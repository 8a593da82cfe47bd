//! The seed's `basic_usage` example. Start a cluster first (`mooncake up`),
//! then `cargo run -p mooncake-store --example basic_usage`.
//! `MOONCAKE_MASTER` and `MOONCAKE_TE_META_DATA_SERVER` override the addresses.

use mooncake_store::{MooncakeStore, ReplicateConfig, StoreError};

fn main() -> Result<(), StoreError> {
    let master = std::env::var("MOONCAKE_MASTER").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let metadata = std::env::var("MOONCAKE_TE_META_DATA_SERVER")
        .unwrap_or_else(|_| "http://127.0.0.1:8080/metadata".into());

    let store = MooncakeStore::new()?;
    store.setup(
        "127.0.0.1",
        &metadata,
        64 << 20,
        64 << 20,
        "tcp",
        "",
        &master,
    )?;

    store.put("my-key", b"hello, mooncake!", None)?;
    let config = ReplicateConfig {
        replica_num: 2,
        with_soft_pin: true,
        ..Default::default()
    };
    store.put("replicated-key", b"replicated value", Some(&config))?;

    println!("exists: {}", store.is_exist("my-key")?);
    println!("size:   {}", store.get_size("my-key")?);
    let data = store.get("my-key")?;
    println!("value:  {}", String::from_utf8_lossy(&data));
    assert_eq!(data, b"hello, mooncake!");

    // Freshly read objects hold a short read lease; force removes anyway.
    store.remove("my-key", true)?;
    store.remove("replicated-key", true)?;
    match store.get("my-key") {
        Err(e) => println!("after remove: error code {}", e.code()),
        Ok(_) => println!("after remove: still there?"),
    }
    Ok(())
}

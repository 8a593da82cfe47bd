//! The Rust API in one pass, as the reference's crate offers it: set up,
//! put (plain and replicated with the 4-field `ReplicateConfig`), check,
//! read back (also zero-copy into a registered buffer), remove by key, by
//! regex and all, and the error of a missing key.
//!
//! Start a cluster first (`mooncake up`), then
//! `cargo run -p mooncake-store --example basic_usage`.
//! `MOONCAKE_MASTER` and `MC_METADATA_SERVER` override the addresses. The
//! system tests run it against a cluster of their own.

use std::ffi::c_void;

use mooncake_store::{MooncakeStore, ReplicateConfig, StoreError};

fn main() {
    let master = std::env::var("MOONCAKE_MASTER").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let metadata = std::env::var("MC_METADATA_SERVER")
        .unwrap_or_else(|_| "http://127.0.0.1:8080/metadata".into());
    if let Err(e) = run(&master, &metadata) {
        eprintln!("basic_usage failed: {e}");
        std::process::exit(1);
    }
}

fn run(master: &str, metadata: &str) -> Result<(), StoreError> {
    let store = MooncakeStore::new()?;
    store.setup("localhost", metadata, 64 << 20, 16 << 20, "tcp", "", master)?;
    store.health_check()?;
    println!("set up as {}", store.get_hostname()?);

    store.put("example-key", b"hello, mooncake!", None)?;
    assert!(store.is_exist("example-key")?);
    assert_eq!(store.get_size("example-key")?, 16);
    assert_eq!(store.get("example-key")?, b"hello, mooncake!");

    let config = ReplicateConfig {
        replica_num: 1,
        with_soft_pin: true,
        with_hard_pin: false,
        preferred_segments: vec![store.get_hostname()?],
    };
    store.put("replicated-key", b"replicated value", Some(&config))?;

    // Zero-copy read into memory the store knows about.
    let mut buf = vec![0u8; 64];
    let ptr = buf.as_mut_ptr() as *mut c_void;
    // SAFETY: `buf` outlives the registration and is not touched meanwhile.
    let n = unsafe {
        store.register_buffer(ptr, buf.len())?;
        let n = store.get_into("replicated-key", ptr, buf.len());
        store.unregister_buffer(ptr)?;
        n?
    };
    assert_eq!(&buf[..n as usize], b"replicated value");

    // Freshly read objects hold a short read lease; force removes anyway.
    store.remove("example-key", true)?;
    assert!(!store.is_exist("example-key")?);
    store.put("batch-1", b"one", None)?;
    store.put("batch-2", b"two", None)?;
    assert_eq!(store.batch_is_exist(&["batch-1", "nope"])?, [true, false]);
    assert_eq!(store.remove_by_regex("^batch-", true)?, 2);
    // Force ignores read leases: an admin call (the master needs
    // --allow_force_remove_all, or the client $MOONCAKE_ADMIN_TOKEN).
    assert_eq!(store.remove_all(true)?, 1, "replicated-key is left");

    match store.get_size("nonexistent") {
        Err(StoreError::OperationFailed(code)) => {
            println!("get_size(\"nonexistent\") failed with code {code}");
            assert_eq!(code, -704);
        }
        other => panic!("a missing key answered {other:?}"),
    }
    Ok(())
}

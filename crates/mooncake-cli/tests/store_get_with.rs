//! `Client::get_with`: a whole object into caller memory allocated once its
//! size is known, from the own segment (one copy) and from another node's
//! segment (through staging), against a real `mooncake_master`.

use std::path::Path;

use mooncake_cli::bench::cluster::{field, work_dir, Proc};
use mooncake_common::{Error, ErrorCode};
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicateConfig;

const MASTER: &str = env!("CARGO_BIN_EXE_mooncake_master");

fn master() -> (Proc, String, String) {
    let args = [
        "--port=0",
        "--rpc_address=127.0.0.1",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1",
        "--http_metadata_server_port=0",
        "--metrics_host=127.0.0.1",
        "--metrics_port=0",
    ];
    let log = work_dir().unwrap().join("get_with_master.log");
    let (proc, line) = Proc::spawn(
        "mooncake_master",
        Path::new(MASTER),
        args,
        &[],
        log,
        "listening",
    )
    .unwrap();
    let rpc = field(&line, "rpc").unwrap().to_string();
    let meta = format!("http://{}/metadata", field(&line, "metadata").unwrap());
    (proc, rpc, meta)
}

fn client(rpc: &str, meta: &str, segment: u64) -> Client {
    Client::setup(&ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: meta.into(),
        global_segment_size: segment,
        local_buffer_size: 8 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: rpc.into(),
    })
    .unwrap()
}

fn read(c: &Client, key: &str) -> Result<(Vec<u8>, usize), Error> {
    let mut buf = Vec::new();
    let mut calls = 0;
    let n = c.get_with(key, |size| {
        calls += 1;
        buf.resize(size, 0xee);
        Ok(buf.as_mut_slice())
    })?;
    assert_eq!(calls, 1);
    Ok((buf, n))
}

#[test]
fn reads_own_and_remote_replicas_into_caller_memory() {
    let (_master, rpc, meta) = master();
    let owner = client(&rpc, &meta, 64 << 20);
    let reader = client(&rpc, &meta, 0);
    let value: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    owner
        .put("gw/k", &value, &ReplicateConfig::default())
        .unwrap();

    for c in [&owner, &reader] {
        let (got, n) = read(c, "gw/k").unwrap();
        assert_eq!(n, value.len());
        assert!(got == value, "bytes differ");
    }

    // A missing key never asks for memory.
    for c in [&owner, &reader] {
        let e = c
            .get_with("gw/missing", |_| -> Result<&mut [u8], Error> {
                panic!("dest asked for a missing key")
            })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND);
        assert_eq!(
            c.get_with("", |_| -> Result<&mut [u8], Error> { panic!("empty key") })
                .unwrap_err()
                .code,
            ErrorCode::OBJECT_NOT_FOUND
        );
    }

    // A destination of the wrong size, or one that fails, is refused.
    let mut small = vec![0u8; 10];
    assert_eq!(
        owner
            .get_with("gw/k", |_| Ok(small.as_mut_slice()))
            .unwrap_err()
            .code,
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        reader
            .get_with("gw/k", |_| Err(Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                "no room"
            )))
            .unwrap_err()
            .code,
        ErrorCode::BUFFER_OVERFLOW
    );
    // Still readable afterwards.
    assert!(read(&reader, "gw/k").unwrap().0 == value);
}

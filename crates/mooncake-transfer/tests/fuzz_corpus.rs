//! The fuzz targets' seed corpus (`fuzz/corpus/<target>/`) for this
//! crate's decoders, made by the real encoders: this test fails when the
//! checked-in files differ from what the encoders produce now.
//! `MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-transfer --test fuzz_corpus`
//! rewrites them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mooncake_transfer::fuzzing::{
    encode_notify, BufferDesc, Header, Kind, RpcMeta, SegmentDesc, ShmDesc,
};

type Seeds = BTreeMap<String, Vec<u8>>;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Compares `seeds` with the target's corpus directory, or rewrites it.
fn check_or_write(target: &str, seeds: &Seeds) {
    let dir = corpus_dir(target);
    if std::env::var("MOONCAKE_FUZZ_CORPUS").as_deref() == Ok("write") {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        return;
    }
    let mut on_disk = Seeds::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        on_disk.insert(name, std::fs::read(&path).unwrap());
    }
    assert!(
        &on_disk == seeds,
        "fuzz/corpus/{target} is not what the encoders make now (files {:?}, expected {:?}); \
         rewrite it with MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-transfer --test fuzz_corpus",
        on_disk.keys().collect::<Vec<_>>(),
        seeds.keys().collect::<Vec<_>>(),
    );
}

fn descriptor() -> SegmentDesc {
    SegmentDesc {
        name: "node0:12345".into(),
        protocol: "tcp".into(),
        devices: vec![],
        buffers: vec![
            BufferDesc {
                name: "cpu:0".into(),
                addr: 0x7f00_0000_0000,
                length: 1 << 30,
                rkey: vec![],
                lkey: vec![],
                shm: Some(ShmDesc {
                    pid: 4242,
                    fd: 17,
                    dev: 24,
                    ino: 1234,
                }),
            },
            BufferDesc {
                name: "*".into(),
                addr: 0x5600_0000_1000,
                length: 4096,
                rkey: vec![],
                lkey: vec![],
                shm: None,
            },
        ],
        tcp_data_port: Some(12345),
        host_id: Some("c0ffee00-1234-5678-9abc-def012345678/pid:[4026531836]".into()),
    }
}

/// The knobs byte the stream targets start with: `piece` bytes per read
/// (1..=64) and the control limit (index 2: 4096 bytes).
fn knobs(piece: u8) -> u8 {
    (2 << 6) | (piece - 1)
}

#[test]
fn engine_seeds() {
    let notify = encode_notify("node1:23456", "{\"event\":\"done\",\"batch\":7}");
    let name = b"node0:12345";
    let desc = descriptor().to_json();
    let head = |kind, seq, addr, len| Header::new(kind, seq, addr, len).encode();
    // One of each request, as an initiator sends them on one connection.
    let mut requests = Vec::new();
    for part in [
        &head(Kind::WriteReq, 1, 0x7f00_0000_0000, 5)[..],
        b"hello",
        &head(Kind::WriteReq, 2, 0x7f00_0000_0005, 3)[..],
        b"abc",
        &head(Kind::ReadReq, 3, 0x7f00_0000_0000, 4096)[..],
        &head(Kind::DescReq, 4, 0, name.len() as u64)[..],
        name,
        &head(Kind::NotifyReq, 5, 0, notify.len() as u64)[..],
        &notify,
    ] {
        requests.extend_from_slice(part);
    }
    // And the answers, which initiators decode.
    let err = Header::response(
        Kind::ReadResp,
        &Header::new(Kind::ReadReq, 3, 0, 4096),
        -601,
        0,
    );
    let mut responses = Vec::new();
    for part in [
        &head(Kind::WriteAck, 1, 0x7f00_0000_0000, 0)[..],
        &head(Kind::ReadResp, 3, 0x7f00_0000_0000, 4)[..],
        b"data",
        &err.encode()[..],
        &head(Kind::DescResp, 4, 0, desc.len() as u64)[..],
        &desc,
        &head(Kind::NotifyAck, 5, 0, 0)[..],
    ] {
        responses.extend_from_slice(part);
    }

    let mut frames = Seeds::new();
    for (name, piece, stream) in [
        ("requests", 64, &requests),
        ("requests_trickled", 1, &requests),
        ("requests_by_7", 7, &requests),
        ("responses", 64, &responses),
    ] {
        let mut seed = vec![knobs(piece)];
        seed.extend_from_slice(stream);
        frames.insert(name.into(), seed);
    }
    check_or_write("engine_frame", &frames);

    let mut notifies = Seeds::new();
    notifies.insert("notify".into(), notify);
    notifies.insert("empty".into(), encode_notify("", ""));
    notifies.insert("utf8".into(), encode_notify("nœud", "✓"));
    check_or_write("engine_notify", &notifies);
}

#[test]
fn metadata_seeds() {
    let mut descs = Seeds::new();
    descs.insert("ours".into(), descriptor().to_json());
    descs.insert(
        "rpc_meta".into(),
        RpcMeta {
            ip_or_host_name: "node0".into(),
            rpc_port: 12345,
        }
        .to_json(),
    );
    // The reference's RDMA shape, with fields we do not read.
    descs.insert(
        "reference_rdma".into(),
        br#"{"name":"node1","protocol":"rdma","devices":[{"name":"mlx5_2","lid":17,"gid":"fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02"}],
"priority_matrix":{"cpu:0":[["mlx5_2"],[]]},
"buffers":[{"name":"cpu:0","addr":140330000000000,"length":1073741824,"rkey":[1,2],"lkey":[3,4]}]}"#
            .to_vec(),
    );
    check_or_write("segment_desc", &descs);

    let json = descriptor().to_json();
    let by_length = [
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            json.len()
        )
        .into_bytes(),
        json.clone(),
    ]
    .concat();
    let chunked = [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        format!("{:x};ext=1\r\n", json.len()).as_bytes(),
        &json,
        b"\r\n0\r\nTrailer: x\r\n\r\n",
    ]
    .concat();
    let mut replies = Seeds::new();
    for (name, piece, reply) in [
        ("by_length", 255, by_length.clone()),
        ("by_length_small_reads", 3, by_length),
        ("chunked", 255, chunked),
        (
            "missing_key",
            255,
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 18\r\n\r\nmetadata not found".to_vec(),
        ),
        (
            "put_then_delete",
            255,
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
                .to_vec(),
        ),
        (
            "close_delimited",
            255,
            b"HTTP/1.0 200 OK\nContent-Type: text/plain\n\nmetadata".to_vec(),
        ),
    ] {
        let mut seed = vec![piece];
        seed.extend_from_slice(&reply);
        replies.insert(name.into(), seed);
    }
    check_or_write("metadata_http_reply", &replies);
}

//! The seed corpus of this crate's fuzz targets: valid messages made by
//! the real encoders (`fuzz/corpus/<target>/`; a test checks the files).

use std::collections::BTreeMap;

use super::frame_knobs;
use crate::frame::{encode_notify, Header, Kind};
use crate::segment::{BufferDesc, RpcMeta, SegmentDesc, ShmDesc};

/// File name → contents.
pub type Seeds = BTreeMap<String, Vec<u8>>;

/// Target name → its seeds.
pub type Corpus = BTreeMap<&'static str, Seeds>;

/// The seeds of every target of this crate, by target (the control limit
/// of the engine-frame seeds is 4096 bytes).
pub fn seeds() -> Corpus {
    let mut all = Corpus::new();
    engine_seeds(&mut all);
    metadata_seeds(&mut all);
    all
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

fn engine_seeds(all: &mut Corpus) {
    let notify = encode_notify("node1:23456", "{\"event\":\"done\",\"batch\":7}");
    let name = b"node0:12345";
    let desc = descriptor().to_json();
    let head = |kind, seq, addr, len| Header::new(kind, seq, addr, len).encode();
    // One of each request, as an initiator sends them on one connection.
    let mut requests = Vec::new();
    for part in [
        &head(Kind::AuthReq, 0, 0, 6)[..],
        b"s3cret",
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
        &head(Kind::AuthAck, 0, 0, 0)[..],
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
        let mut seed = vec![frame_knobs(piece, 2)];
        seed.extend_from_slice(stream);
        frames.insert(name.into(), seed);
    }
    all.insert("engine_frame", frames);

    let mut notifies = Seeds::new();
    notifies.insert("notify".into(), notify);
    notifies.insert("empty".into(), encode_notify("", ""));
    notifies.insert("utf8".into(), encode_notify("nœud", "✓"));
    all.insert("engine_notify", notifies);
}

fn metadata_seeds(all: &mut Corpus) {
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
    all.insert("segment_desc", descs);

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
    all.insert("metadata_http_reply", replies);
}

//! A dummy service (`StoreService`) to talk to frame by frame
//! (`super::raw`).

use std::io::{Read, Write};

use mooncake_common::ErrorCode;
use mooncake_store::client::dummy_proto::{DummyRequest, DummyResponse};
use mooncake_store::client::{ServiceConfig, ServiceLimits, StoreService};

use super::Cluster;

/// A dummy service on loopback over a 16 MiB storage client of `cluster`.
pub fn service(cluster: &Cluster, limits: ServiceLimits) -> StoreService {
    StoreService::start(&ServiceConfig {
        client: cluster.config(16 << 20, 0),
        host: "127.0.0.1".into(),
        port: 0,
        limits,
        allowed_uids: Vec::new(),
    })
    .unwrap()
}

/// The service's answer to raw `bytes` on `s`.
pub fn answer(s: &mut (impl Read + Write), bytes: &[u8]) -> DummyResponse {
    super::raw::answer(s, bytes)
}

/// The service's answer to `req` on `s`.
pub fn call(s: &mut (impl Read + Write), req: &DummyRequest) -> DummyResponse {
    super::raw::call(s, req)
}

/// The error code of a failed unit answer.
pub fn error_of(resp: DummyResponse) -> ErrorCode {
    match resp {
        DummyResponse::Unit { result: Err(e) } => e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}

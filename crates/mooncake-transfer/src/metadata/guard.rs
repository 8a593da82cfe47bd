//! What the HTTP metadata server accepts: size and count budgets, the
//! optional cluster token, and the protection of a live engine's keys.
//!
//! - A value larger than [`ServerPolicy::max_value_size`] is refused (413),
//!   and so is a new key once [`ServerPolicy::max_keys`] are held (507).
//! - With a cluster token, `PUT` and `DELETE` need
//!   `Authorization: Bearer <token>` (401 otherwise). Reads stay open:
//!   what they disclose (addresses, ports) buys nothing against engines
//!   that require the token themselves.
//! - Without a token, an engine's keys cannot be taken over while it
//!   lives: a `PUT` of `mooncake/ram/<name>` that changes who serves the
//!   segment (protocol, data port, host id, or the processes its shared
//!   buffers live in), and a `DELETE` of `mooncake/ram/<name>` or
//!   `mooncake/rpc_meta/<name>`, are refused (409) while the port that
//!   `mooncake/rpc_meta/<name>` names accepts connections. An engine
//!   updates its own descriptor (buffers registered, unregistered) freely,
//!   and deletes its keys after closing its port.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use mooncake_common::auth::ClusterToken;

use crate::segment::{RpcMeta, SegmentDesc};

/// Default largest value: a descriptor of many thousands of buffers fits.
pub const DEFAULT_MAX_VALUE_SIZE: usize = 16 << 20;
/// Default most keys (two per engine).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;
/// How long a liveness probe of an engine's port may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The metadata server's limits and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerPolicy {
    pub max_value_size: usize,
    pub max_keys: usize,
    /// Required on writes when set.
    pub cluster_token: Option<ClusterToken>,
}

impl Default for ServerPolicy {
    fn default() -> Self {
        ServerPolicy {
            max_value_size: DEFAULT_MAX_VALUE_SIZE,
            max_keys: DEFAULT_MAX_KEYS,
            cluster_token: None,
        }
    }
}

impl ServerPolicy {
    /// Whether a write carrying this `Authorization` header may go on.
    pub(crate) fn authorizes(&self, authorization: Option<&[u8]>) -> bool {
        self.cluster_token
            .as_ref()
            .is_none_or(|t| t.matches_bearer(authorization))
    }

    /// Whether live engines' keys need the liveness rule (no token: anyone
    /// may write, so who writes is not known).
    pub(crate) fn guards_live_keys(&self) -> bool {
        self.cluster_token.is_none()
    }
}

/// The engine name a segment key (`mooncake/ram/<name>`) or location key
/// (`mooncake/rpc_meta/<name>`) belongs to.
pub(crate) fn engine_of(key: &str) -> Option<&str> {
    key.strip_prefix("mooncake/ram/")
        .or_else(|| key.strip_prefix("mooncake/rpc_meta/"))
        .filter(|n| !n.is_empty())
}

/// Who serves a segment, as its descriptor says: what a stranger must not
/// change under a live owner.
#[derive(Debug)]
struct Server {
    protocol: String,
    tcp_data_port: Option<u16>,
    host_id: Option<String>,
    shm_pids: BTreeSet<u32>,
}

fn server_of(value: &[u8]) -> Option<Server> {
    let d = SegmentDesc::from_json(value).ok()?;
    Some(Server {
        shm_pids: d
            .buffers
            .iter()
            .filter_map(|b| b.shm.as_ref().map(|s| s.pid))
            .collect(),
        protocol: d.protocol,
        tcp_data_port: d.tcp_data_port,
        host_id: d.host_id,
    })
}

/// Whether replacing `old` by `new` under a segment key changes who
/// serves the segment (an unreadable old value protects nothing).
pub(crate) fn changes_server(old: &[u8], new: &[u8]) -> bool {
    let Some(before) = server_of(old) else {
        return false;
    };
    let Some(after) = server_of(new) else {
        return true;
    };
    // Shared buffers live in the owner's process: once one is published,
    // later ones must live there too (an engine's first shared buffer
    // adds its pid).
    let moved = after.shm_pids.len() > 1
        || (!before.shm_pids.is_empty() && !after.shm_pids.is_subset(&before.shm_pids));
    moved
        || before.protocol != after.protocol
        || before.tcp_data_port != after.tcp_data_port
        || before.host_id != after.host_id
}

/// Whether the engine whose location record is `rpc_meta` accepts
/// connections now.
pub(crate) async fn is_alive(rpc_meta: &[u8]) -> bool {
    let Ok(meta) = serde_json::from_slice::<RpcMeta>(rpc_meta) else {
        return false;
    };
    let host = meta
        .ip_or_host_name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let Ok(addrs) = tokio::net::lookup_host((host.as_str(), meta.rpc_port)).await else {
        return false;
    };
    let addrs: Vec<SocketAddr> = addrs.collect();
    for addr in addrs {
        let connect = tokio::net::TcpStream::connect(addr);
        if let Ok(Ok(_)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{BufferDesc, ShmDesc};

    fn desc(port: u16, pid: Option<u32>, addr: u64) -> Vec<u8> {
        SegmentDesc {
            name: "e".into(),
            protocol: "tcp".into(),
            devices: Vec::new(),
            buffers: vec![BufferDesc {
                name: "cpu:0".into(),
                addr,
                length: 4096,
                rkey: Vec::new(),
                lkey: Vec::new(),
                shm: pid.map(|pid| ShmDesc {
                    pid,
                    fd: 3,
                    dev: 1,
                    ino: 2,
                }),
            }],
            tcp_data_port: Some(port),
            host_id: Some("h".into()),
        }
        .to_json()
    }

    #[test]
    fn a_new_server_is_a_change_new_buffers_are_not() {
        let old = desc(1000, Some(7), 0x1000);
        assert!(!changes_server(&old, &desc(1000, Some(7), 0x9000)));
        assert!(changes_server(&old, &desc(1001, Some(7), 0x1000)));
        assert!(changes_server(&old, &desc(1000, Some(8), 0x1000)));
        // An engine's first shared buffer is no change of server.
        assert!(!changes_server(&desc(1000, None, 0x1000), &old));
        assert!(changes_server(&old, b"not json"));
        assert!(!changes_server(b"not json", &old));
    }

    #[test]
    fn keys_name_their_engine() {
        assert_eq!(engine_of("mooncake/ram/a:1"), Some("a:1"));
        assert_eq!(engine_of("mooncake/rpc_meta/a:1"), Some("a:1"));
        assert_eq!(engine_of("mooncake/ram/"), None);
        assert_eq!(engine_of("other"), None);
    }

    #[test]
    fn writes_need_the_token_when_one_is_set() {
        let open = ServerPolicy::default();
        assert!(open.authorizes(None));
        assert!(open.guards_live_keys());
        let closed = ServerPolicy {
            cluster_token: Some(ClusterToken::new("t").unwrap()),
            ..ServerPolicy::default()
        };
        assert!(!closed.authorizes(None));
        assert!(!closed.authorizes(Some(b"Bearer u")));
        assert!(closed.authorizes(Some(b"Bearer t")));
        assert!(!closed.guards_live_keys());
    }

    #[tokio::test]
    async fn a_listening_port_is_alive() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let meta = format!(r#"{{"ip_or_host_name":"127.0.0.1","rpc_port":{port}}}"#);
        assert!(is_alive(meta.as_bytes()).await);
        drop(l);
        assert!(!is_alive(meta.as_bytes()).await);
        assert!(!is_alive(b"{}").await);
    }
}

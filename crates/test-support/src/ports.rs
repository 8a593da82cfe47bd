//! Ports for the listeners tests start: only ever free ones.
//!
//! A master reads `rpc_port = 0` as "use `port`", whose default is the
//! reference's fixed 50051, and its HTTP service and metadata server default
//! to 9003 and 8080: a test that names only some of them binds a fixed port
//! and fails while anything else on the machine holds it. Tests therefore
//! name every port, through [`MASTER_ANY_PORTS`] (settings) or [`MasterPorts`]
//! (flags), each either 0 (any free port, read back) or a [`free_port`].

use std::net::TcpListener;

/// Every port setting of a master, each 0 (the OS picks): `rpc_port` and its
/// fallback `port` both, so the RPC port cannot fall back to 50051.
pub const MASTER_ANY_PORTS: [(&str, &str); 4] = [
    ("rpc_port", "0"),
    ("port", "0"),
    ("metrics_port", "0"),
    ("http_metadata_server_port", "0"),
];

/// The ports a `mooncake_master` process listens on, each named: 0 is any
/// free port (the test reads the bound one back), anything else a port the
/// test chose with [`free_port`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MasterPorts {
    pub rpc: u16,
    pub metrics: u16,
    pub metadata: u16,
}

impl MasterPorts {
    /// Every port picked by the OS.
    pub const ANY: MasterPorts = MasterPorts {
        rpc: 0,
        metrics: 0,
        metadata: 0,
    };

    /// As flags: `--port` repeats `--rpc_port`, so 0 stays "any".
    pub fn args(&self) -> Vec<String> {
        vec![
            format!("--rpc_port={}", self.rpc),
            format!("--port={}", self.rpc),
            format!("--metrics_port={}", self.metrics),
            format!("--http_metadata_server_port={}", self.metadata),
        ]
    }
}

/// A port nothing listens on right now, for a child to bind.
///
/// Taken below the kernel's ephemeral range: a port the kernel hands out
/// (bind to 0) can be taken again by any outgoing connection before the
/// child binds it, and tests that open thousands of connections made that
/// race real. Ports here are only ever taken by an explicit bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (low, high) = non_ephemeral_range();
    // Processes differ by pid and start time; calls in one process by NEXT.
    let seed = u64::from(std::process::id()) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into());
    for _ in 0..10_000 {
        let mut x = seed.wrapping_add(NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed));
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        let port = low + (x % u64::from(high - low)) as u16;
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high}");
}

/// Ports below the ephemeral range (`ip_local_port_range`), above 10000.
fn non_ephemeral_range() -> (u16, u16) {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if start > 12_000 {
        (10_000, start)
    } else {
        (61_000, 65_535)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rpc_port_never_falls_back_to_a_fixed_one() {
        for (name, value) in MASTER_ANY_PORTS {
            assert_eq!(value, "0", "{name}");
        }
        let any = MasterPorts::ANY.args();
        assert!(any.contains(&"--rpc_port=0".into()) && any.contains(&"--port=0".into()));
        let fixed = MasterPorts {
            rpc: 12345,
            ..MasterPorts::ANY
        }
        .args();
        assert!(fixed.contains(&"--rpc_port=12345".into()));
        assert!(fixed.contains(&"--port=12345".into()));
        assert!(fixed.contains(&"--metrics_port=0".into()));
        assert!(fixed.contains(&"--http_metadata_server_port=0".into()));
    }
}

//! Segment descriptors as published in the metadata store, in the
//! reference's JSON shape:
//!
//! - `mooncake/ram/<name>` → `{"name", "protocol", "buffers": [{"name", "addr", "length", …}], …}`
//! - `mooncake/rpc_meta/<name>` → `{"ip_or_host_name", "rpc_port"}`
//!
//! Our additions (`host_id`, and `shm` on engine-managed buffers) are
//! optional fields that other readers ignore.

use serde::{Deserialize, Serialize};

use mooncake_common::{Error, ErrorCode, Result};

use crate::rawmem;

/// A RAM segment: the buffers one engine exposes to its peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDesc {
    pub name: String,
    pub protocol: String,
    #[serde(default)]
    pub devices: Vec<serde_json::Value>,
    #[serde(default)]
    pub buffers: Vec<BufferDesc>,
    /// Port of the TCP data path (ours is the RPC port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_port: Option<u16>,
    /// Same boot and same PID namespace as the reader ⇒ `shm` buffers can be
    /// mapped through `/proc`. See [`local_host_id`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
}

/// One registered buffer of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDesc {
    /// The location it was registered with (`cpu:0`, `*`, …).
    pub name: String,
    /// Virtual address in the owner's process; requests name remote bytes by it.
    pub addr: u64,
    pub length: u64,
    #[serde(default)]
    pub rkey: Vec<u32>,
    #[serde(default)]
    pub lkey: Vec<u32>,
    /// Present when the buffer is engine-managed shared memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<ShmDesc>,
}

/// Where a same-host peer finds a managed buffer: `/proc/<pid>/fd/<fd>`,
/// which must be the file `(dev, ino)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmDesc {
    pub(crate) pid: u32,
    pub(crate) fd: i32,
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

/// `mooncake/rpc_meta/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RpcMeta {
    pub(crate) ip_or_host_name: String,
    pub(crate) rpc_port: u16,
}

impl SegmentDesc {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("descriptor serializes")
    }

    pub(crate) fn from_json(bytes: &[u8]) -> Result<SegmentDesc> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::new(
                ErrorCode::ERR_MALFORMED_JSON,
                format!("segment descriptor: {e}"),
            )
        })
    }

    /// The buffer holding all of `[addr, addr+len)`.
    pub(crate) fn find_buffer(&self, addr: u64, len: u64) -> Option<&BufferDesc> {
        self.buffers.iter().find(|b| b.contains(addr, len))
    }

    /// Address of the first buffer, 0 when there is none.
    pub fn first_buffer_address(&self) -> u64 {
        self.buffers.first().map_or(0, |b| b.addr)
    }
}

impl BufferDesc {
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        match (
            usize::try_from(self.addr),
            usize::try_from(self.length),
            usize::try_from(addr),
            usize::try_from(len),
        ) {
            (Ok(base), Ok(blen), Ok(a), Ok(l)) => rawmem::contains(base, blen, a, l),
            _ => false,
        }
    }
}

impl RpcMeta {
    pub(crate) fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("rpc meta serializes")
    }

    pub(crate) fn from_json(bytes: &[u8]) -> Result<RpcMeta> {
        serde_json::from_slice(bytes)
            .map_err(|e| Error::new(ErrorCode::ERR_MALFORMED_JSON, format!("rpc meta: {e}")))
    }
}

/// Identifies "this boot of this machine, this PID namespace": two engines
/// with equal ids can open each other's `/proc/<pid>/fd/<fd>`.
pub(crate) fn local_host_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pidns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!("{}/{}", boot.trim(), pidns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_reference_shape() {
        let json = br#"{"name":"node1","protocol":"rdma","devices":[{"name":"mlx5_2","lid":17,"gid":"fe:00"}],
            "priority_matrix":{"cpu:0":[["mlx5_2"],[]]},
            "buffers":[{"name":"cpu:0","addr":140330000000000,"length":1073741824,"rkey":[1,2],"lkey":[3,4]}]}"#;
        let d = SegmentDesc::from_json(json).unwrap();
        assert_eq!(d.name, "node1");
        assert_eq!(d.buffers[0].length, 1 << 30);
        assert_eq!(d.buffers[0].shm, None);
        assert_eq!(d.first_buffer_address(), 140330000000000);
        assert!(d.find_buffer(140330000000000 + 10, 10).is_some());
        assert!(d.find_buffer(140330000000000 + (1 << 30), 1).is_none());
    }

    #[test]
    fn writes_the_reference_keys() {
        let d = SegmentDesc {
            name: "h:1".into(),
            protocol: "tcp".into(),
            devices: vec![],
            buffers: vec![BufferDesc {
                name: "cpu:0".into(),
                addr: 4096,
                length: 8192,
                rkey: vec![],
                lkey: vec![],
                shm: Some(ShmDesc {
                    pid: 1,
                    fd: 3,
                    dev: 5,
                    ino: 7,
                }),
            }],
            tcp_data_port: Some(1),
            host_id: None,
        };
        let v: serde_json::Value = serde_json::from_slice(&d.to_json()).unwrap();
        assert_eq!(v["name"], "h:1");
        assert_eq!(v["protocol"], "tcp");
        assert_eq!(v["buffers"][0]["addr"], 4096);
        assert_eq!(v["buffers"][0]["length"], 8192);
        assert_eq!(v["buffers"][0]["name"], "cpu:0");
        assert_eq!(SegmentDesc::from_json(&d.to_json()).unwrap(), d);
        let m = RpcMeta {
            ip_or_host_name: "node01".into(),
            rpc_port: 12345,
        };
        let v: serde_json::Value = serde_json::from_slice(&m.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ip_or_host_name": "node01", "rpc_port": 12345})
        );
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert_eq!(
            SegmentDesc::from_json(b"{").unwrap_err().code,
            ErrorCode::ERR_MALFORMED_JSON
        );
        assert_eq!(
            RpcMeta::from_json(b"[]").unwrap_err().code,
            ErrorCode::ERR_MALFORMED_JSON
        );
    }

    #[test]
    fn host_id_is_stable() {
        assert_eq!(local_host_id(), local_host_id());
    }
}

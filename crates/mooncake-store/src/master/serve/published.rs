//! A mount checked against what its engine published: when the master
//! runs the HTTP metadata server its engines publish to, a segment must
//! lie inside a buffer of the descriptor `mooncake/ram/<endpoint>` names,
//! so nobody can mount memory the engine at that endpoint never offered.
//! An endpoint with no descriptor there (engines publishing elsewhere, or
//! P2P handshakes) is not checked: the master cannot see it.

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::metadata::http_server::MemoryStore;
use mooncake_transfer::metadata::segment_key;
use mooncake_transfer::SegmentDesc;

use crate::types::SegmentInfo;

/// Whether `seg` matches the descriptor its endpoint published in `store`.
pub(crate) fn check_mount(store: &MemoryStore, seg: &SegmentInfo) -> Result<()> {
    match store.get_bytes(&segment_key(&seg.transport_endpoint)) {
        Some(desc) => check_against(&desc, seg),
        None => Ok(()),
    }
}

fn check_against(desc: &[u8], seg: &SegmentInfo) -> Result<()> {
    let mismatch = |why: &str| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "segment {} [{:#x}, +{}) does not match what engine {} published: {why}",
                seg.name, seg.base, seg.size, seg.transport_endpoint
            ),
        )
    };
    let desc: SegmentDesc =
        serde_json::from_slice(desc).map_err(|_| mismatch("its descriptor does not parse"))?;
    let end = seg
        .base
        .checked_add(seg.size)
        .ok_or_else(|| mismatch("range overflows"))?;
    let inside = desc.buffers.iter().any(|b| {
        b.addr <= seg.base
            && b.addr
                .checked_add(b.length)
                .is_some_and(|b_end| end <= b_end)
    });
    if inside {
        Ok(())
    } else {
        Err(mismatch("no registered buffer holds that range"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_transfer::BufferDesc;

    fn desc(buffers: &[(u64, u64)]) -> Vec<u8> {
        SegmentDesc {
            name: "e:1".into(),
            protocol: "tcp".into(),
            devices: Vec::new(),
            buffers: buffers
                .iter()
                .map(|&(addr, length)| BufferDesc {
                    name: "cpu:0".into(),
                    addr,
                    length,
                    rkey: Vec::new(),
                    lkey: Vec::new(),
                    shm: None,
                })
                .collect(),
            tcp_data_port: Some(1),
            host_id: None,
        }
        .to_json()
    }

    fn seg(base: u64, size: u64) -> SegmentInfo {
        SegmentInfo {
            name: "e:1".into(),
            base,
            size,
            transport_endpoint: "e:1".into(),
        }
    }

    #[test]
    fn a_segment_must_lie_in_a_published_buffer() {
        let d = desc(&[(0x1000, 0x1000), (0x10000, 0x100)]);
        assert!(check_against(&d, &seg(0x1000, 0x1000)).is_ok());
        assert!(check_against(&d, &seg(0x1800, 0x800)).is_ok());
        assert!(check_against(&d, &seg(0x10000, 0x100)).is_ok());
        for bad in [seg(0x1000, 0x1001), seg(0x800, 0x100), seg(0x2000, 1)] {
            let e = check_against(&d, &bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        }
        assert!(check_against(b"junk", &seg(0x1000, 1)).is_err());
    }

    #[test]
    fn unpublished_endpoints_are_not_checked() {
        let store = MemoryStore::new();
        assert!(check_mount(&store, &seg(0x1000, 1)).is_ok());
        publish(&store, &desc(&[(0x1000, 0x10)]));
        assert!(check_mount(&store, &seg(0x1000, 0x10)).is_ok());
        assert!(check_mount(&store, &seg(0x2000, 0x10)).is_err());
    }

    fn publish(store: &MemoryStore, desc: &[u8]) {
        use mooncake_transfer::metadata::MetadataStore;
        store.put(&segment_key("e:1"), desc).unwrap();
    }
}

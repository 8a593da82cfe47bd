//! The buffers this store registered with its engine, counted: a payload
//! registered and another replicated into the same range register it once,
//! and it is unregistered when the last of them lets go. A range that
//! overlaps a registered one without being the same is refused, as in the
//! reference.

use mooncake_transfer::TransferEngine;
use parking_lot::Mutex;

use crate::error::{P2pError, Result};

#[derive(Default)]
pub(crate) struct Registered {
    /// `(addr, len, users)`.
    ranges: Mutex<Vec<(u64, u64, usize)>>,
}

impl Registered {
    pub(crate) fn add(
        &self,
        engine: &TransferEngine,
        addr: u64,
        len: u64,
        location: &str,
    ) -> Result<()> {
        let mut ranges = self.ranges.lock();
        for r in ranges.iter_mut() {
            if r.0 == addr && r.1 == len {
                r.2 += 1;
                return Ok(());
            }
            if addr < r.0 + r.1 && r.0 < addr + len {
                return Err(P2pError::AddressOverlapped);
            }
        }
        let (a, l) = to_usize(addr, len)?;
        engine.register_local_memory(a, l, location, true)?;
        ranges.push((addr, len, 1));
        Ok(())
    }

    /// Adds every buffer or none.
    pub(crate) fn add_all(
        &self,
        engine: &TransferEngine,
        buffers: &[(u64, u64)],
        location: &str,
    ) -> Result<()> {
        for (i, &(addr, len)) in buffers.iter().enumerate() {
            if let Err(e) = self.add(engine, addr, len, location) {
                self.remove_all(engine, &buffers[..i]);
                return Err(e);
            }
        }
        Ok(())
    }

    pub(crate) fn remove_all(&self, engine: &TransferEngine, buffers: &[(u64, u64)]) {
        let mut ranges = self.ranges.lock();
        for &(addr, len) in buffers {
            let Some(i) = ranges.iter().position(|r| r.0 == addr && r.1 == len) else {
                continue;
            };
            ranges[i].2 -= 1;
            if ranges[i].2 == 0 {
                ranges.swap_remove(i);
                if let Err(e) = engine.unregister_local_memory(addr as usize) {
                    tracing::warn!("unregistering {addr:#x}+{len}: {e}");
                }
            }
        }
    }
}

fn to_usize(addr: u64, len: u64) -> Result<(usize, usize)> {
    match (usize::try_from(addr), usize::try_from(len)) {
        (Ok(a), Ok(l)) => Ok((a, l)),
        _ => Err(P2pError::invalid(format!(
            "{addr:#x}+{len} does not fit this machine's addresses"
        ))),
    }
}

//! A consistent view of the replicated state at one log position, taken
//! from the live tables without copying them (what a snapshot encodes).
//!
//! A cut (`ObjectMap::cut`) waits for the mutations under way to end and
//! holds new ones for an instant: every mutation holds the cut out from
//! before it is logged until it is applied (`MasterService::observe`,
//! the object tables' writes). While it holds them, the cut reads the log
//! position and the small tables (segments, clients, tasks, retired
//! ranges, SSD tiers and copies, reserved space, groups); the object
//! tables are written out from the live tables by the cut's round
//! (`objects::walk`): a write to an object the round has not reached yet
//! saves that object's encoded form first. The small tables are read
//! with `try_lock`: a thread may hold one of them while it waits for the
//! cut to open, so a busy table makes the cut open and try again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};

use super::image::{encode_object, out_segments};
use super::objects::Round;
use super::segments::{Placement, Segment};
use super::service::MasterService;
use super::ssd_tier::DiskCopy;
use super::tasks::TaskRecord;
use crate::proto::wire::Encode;
use crate::types::ClientId;

/// How long a cut keeps trying while some small table stays busy.
const CUT_PATIENCE: Duration = Duration::from_secs(10);

/// The replicated state at one cut.
pub(crate) struct View<'a> {
    next_id: u32,
    mounted: Vec<Arc<Segment>>,
    clients: Vec<(ClientId, u64)>,
    tasks: Vec<TaskRecord>,
    retired: Vec<(Placement, u64, u64)>,
    tiers: Vec<(ClientId, String, String, u64)>,
    copies: Vec<(String, DiskCopy)>,
    reserved: Vec<(Arc<Segment>, u64, u64)>,
    groups: Vec<(Arc<str>, Vec<Arc<str>>)>,
    /// The objects as they stood at the cut.
    objects: Round<'a>,
}

/// The small tables, read at the cut.
type Small = (
    Vec<(ClientId, u64)>,
    Vec<TaskRecord>,
    Vec<(Placement, u64, u64)>,
    (
        Vec<(ClientId, String, String, u64)>,
        Vec<(String, DiskCopy)>,
    ),
    Vec<(Arc<Segment>, u64, u64)>,
    Vec<(Arc<str>, Vec<Arc<str>>)>,
);

impl MasterService {
    /// Cuts the state: `at_cut` runs at the cut (read the log position
    /// there), and its answer comes back with the view.
    pub(crate) fn cut_view<T>(&self, mut at_cut: impl FnMut() -> T) -> Result<(View<'_>, T)> {
        let started = Instant::now();
        loop {
            let cut = self.objects.cut(encode_object, || {
                let (mounted, next_id) = self.segments.all_and_next_id();
                let small = self.try_small(&mounted)?;
                // Objects may name an unmounted segment only while one is
                // held by more than the table of unmounted segments.
                let named = self.segments.unmounted_in_use();
                let ids = named.then(|| mounted.iter().map(|s| s.id).collect());
                Some(((mounted, next_id, small, at_cut()), ids))
            });
            if let Some(((mounted, next_id, small, t), objects)) = cut {
                let (clients, tasks, retired, (tiers, copies), reserved, groups) = small;
                let view = View {
                    next_id,
                    mounted,
                    clients,
                    tasks,
                    retired,
                    tiers,
                    copies,
                    reserved,
                    groups,
                    objects,
                };
                return Ok((view, t));
            }
            if started.elapsed() > CUT_PATIENCE {
                return Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("snapshot cut: the tables stayed busy for {CUT_PATIENCE:?}"),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn try_small(&self, mounted: &[Arc<Segment>]) -> Option<Small> {
        let clients = self.clients.try_lock()?.iter().collect();
        let tasks = self.tasks.try_lock()?.export();
        let retired = self.retired.try_export()?;
        let disk = self.disk.try_export()?;
        let mut reserved = Vec::new();
        for s in mounted {
            for (offset, len) in s.try_reserved_ranges()? {
                reserved.push((s.clone(), offset, len));
            }
        }
        let groups = self.objects.groups.try_export()?;
        Some((clients, tasks, retired, disk, reserved, groups))
    }
}

impl View<'_> {
    /// Appends its image (`image`'s format) to `out`, handing `out` to
    /// `flush` whenever it holds more than `chunk` bytes (`flush` empties
    /// it), so the encoded objects need not be held whole. Returns how
    /// many objects it held.
    pub(crate) fn encode(
        self,
        out: &mut Vec<u8>,
        chunk: usize,
        flush: &mut dyn FnMut(&mut Vec<u8>) -> Result<()>,
    ) -> Result<u64> {
        self.next_id.encode(out);
        out_segments(out, self.mounted.iter());
        let mounted: HashSet<u32> = self.mounted.iter().map(|s| s.id).collect();
        out_segments(out, self.objects.detached()?.iter());

        self.clients.len().encode(out);
        for (c, t) in &self.clients {
            c.encode(out);
            t.encode(out);
        }

        let objects = self.objects.objects()?;
        objects.encode(out);
        let written = self.objects.write(out, chunk, flush)?;
        if written != objects {
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("snapshot round wrote {written} objects of the {objects} at its cut"),
            ));
        }

        self.tasks.len().encode(out);
        for t in &self.tasks {
            t.assignment.encode(out);
            t.status.encode(out);
            t.client.encode(out);
            t.created.encode(out);
            t.updated.encode(out);
            t.message.encode(out);
        }

        let retired: Vec<_> = self
            .retired
            .iter()
            .filter(|(p, _, _)| mounted.contains(&p.segment.id))
            .collect();
        retired.len().encode(out);
        for (p, size, free_at) in retired {
            p.segment.id.encode(out);
            p.offset.encode(out);
            size.encode(out);
            free_at.encode(out);
        }

        self.tiers.len().encode(out);
        for (client, tier_id, endpoint, capacity) in &self.tiers {
            client.encode(out);
            tier_id.encode(out);
            endpoint.encode(out);
            capacity.encode(out);
        }
        self.copies.len().encode(out);
        for (key, copy) in &self.copies {
            key.encode(out);
            copy.owner.encode(out);
            copy.size.encode(out);
        }

        self.reserved.len().encode(out);
        for (seg, offset, len) in &self.reserved {
            seg.id.encode(out);
            offset.encode(out);
            len.encode(out);
        }

        self.groups.len().encode(out);
        for (name, members) in &self.groups {
            name.encode(out);
            members.len().encode(out);
            for key in members {
                key.encode(out);
            }
        }
        Ok(objects)
    }
}

//! The prefix index: which instance holds which block, on which medium and
//! data-parallel rank. Pure: no sockets, no clock; the service feeds it
//! decoded batches and asks it questions.
//!
//! Blocks live in namespaces (tenant, model, LoRA, salt, block size): a
//! query only ever sees its own. Within one, a block is its rolling hash
//! under the standard (`crate::hash`). Engines that hash otherwise (vLLM's
//! SHA-256, SGLang's own) send their blocks' tokens; the index recomputes
//! the standard hash from them and remembers, per subscription, which
//! engine hash stands for which block, so that later events naming only
//! the engine's hash (removals, CPU-offload stores) find it.

mod holders;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxHashMap;

use crate::event::{Batch, Event, Medium, Removed, Stored};
use crate::hash;
use holders::{Holder, Holders};

/// A subscription's id: never reused, so a late event of an unregistered
/// publisher finds nothing.
pub type SubId = u32;

/// The publisher formats the index knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Vllm,
    Sglang,
    Mooncake,
}

impl Kind {
    /// The registration's `type`, case-insensitively.
    pub fn parse(s: &str) -> Option<Kind> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Some(Kind::Vllm),
            "sglang" => Some(Kind::Sglang),
            "mooncake" => Some(Kind::Mooncake),
            _ => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::Vllm => "vLLM",
            Kind::Sglang => "SGLang",
            Kind::Mooncake => "Mooncake",
        }
    }
}

/// The isolation dimensions: blocks of one namespace never answer a query
/// of another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace {
    pub tenant: String,
    pub model: String,
    /// Empty for the base model.
    pub lora: String,
    /// Empty for none.
    pub salt: String,
    pub block_size: u32,
}

/// What a registration says about a publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubInfo {
    pub instance_id: String,
    pub kind: Kind,
    pub dp_rank: u32,
    /// Its blocks' namespace unless an event names another LoRA, salt or tenant.
    pub namespace: Namespace,
}

/// What applying one batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Blocks added to a medium (including re-stores).
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub cleared: u64,
    /// Events the index could not place: a parent it never saw, tokens that
    /// do not fill the blocks, a block size other than the registration's.
    pub rejected: u64,
}

/// One instance's answer, in blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceHit {
    /// The longest prefix some medium of the instance holds.
    pub longest_matched: u64,
    /// Of those blocks, how many each medium holds.
    pub gpu: u64,
    pub cpu: u64,
    pub disk: u64,
    /// Of those blocks, how many each data-parallel rank holds on its device.
    pub dp: BTreeMap<u32, u64>,
}

impl InstanceHit {
    pub fn medium(&self, m: Medium) -> u64 {
        match m {
            Medium::Gpu => self.gpu,
            Medium::Cpu => self.cpu,
            Medium::Disk => self.disk,
        }
    }
}

struct Sub {
    info: SubInfo,
    default_ns: u32,
    /// Namespaces this subscription has blocks in (usually one).
    touched: Vec<u32>,
    /// Engine hash → (namespace, standard hash), for engines that hash
    /// otherwise.
    engine: FxHashMap<u64, (u32, u64)>,
}

#[derive(Default)]
struct Table {
    blocks: FxHashMap<u64, Holders>,
}

/// The index. Not thread-safe by itself: the service keeps it behind a lock.
pub struct Index {
    seed: u64,
    ns_ids: HashMap<Namespace, u32>,
    tables: Vec<Table>,
    subs: FxHashMap<SubId, Sub>,
    next_sub: SubId,
    /// Distinct (namespace, block) pairs held somewhere.
    blocks: usize,
}

impl Index {
    pub fn new(seed: u64) -> Index {
        Index {
            seed,
            ns_ids: HashMap::new(),
            tables: Vec::new(),
            subs: FxHashMap::default(),
            next_sub: 1,
            blocks: 0,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Distinct blocks indexed (a block held by several instances or media
    /// counts once per namespace).
    pub fn len(&self) -> usize {
        self.blocks
    }

    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// Adds a subscription; its id names it from now on.
    pub fn register(&mut self, info: SubInfo) -> SubId {
        let id = self.next_sub;
        self.next_sub = self.next_sub.wrapping_add(1).max(1);
        let default_ns = self.ns_id(&info.namespace);
        self.subs.insert(
            id,
            Sub {
                info,
                default_ns,
                touched: vec![default_ns],
                engine: FxHashMap::default(),
            },
        );
        id
    }

    /// Drops a subscription and every block it held, at once.
    pub fn unregister(&mut self, sub: SubId) -> bool {
        if !self.subs.contains_key(&sub) {
            return false;
        }
        self.drop_holders(sub);
        self.subs.remove(&sub);
        true
    }

    pub fn sub_info(&self, sub: SubId) -> Option<&SubInfo> {
        self.subs.get(&sub).map(|s| &s.info)
    }

    /// Every subscription, by id.
    pub fn subs(&self) -> impl Iterator<Item = (SubId, &SubInfo)> {
        self.subs.iter().map(|(id, s)| (*id, &s.info))
    }

    /// Marks everything `sub` holds now as stale: not counted in answers
    /// until the publisher stores the block again. For a gap in a
    /// publisher's events that could not be replayed, where any block may
    /// have been removed unseen. Returns how many (block, medium) entries
    /// became stale.
    pub fn mark_stale(&mut self, sub: SubId) -> u64 {
        let Some(s) = self.subs.get(&sub) else {
            return 0;
        };
        let mut n = 0;
        for &ns in &s.touched {
            for holders in self.tables[ns as usize].blocks.values_mut() {
                if let Some(h) = holders.get_mut(sub) {
                    n += u64::from((h.media & !h.stale).count_ones());
                    h.stale = h.media;
                }
            }
        }
        n
    }

    /// Applies a batch of `sub`'s events in order; `None` when `sub` is not
    /// registered (its events are ignored).
    pub fn apply(&mut self, sub: SubId, batch: &Batch) -> Option<Applied> {
        if !self.subs.contains_key(&sub) {
            return None;
        }
        let mut out = Applied::default();
        for ev in &batch.events {
            match ev {
                Event::Stored(s) => match self.store(sub, s) {
                    Some(n) => out.stored_blocks += n,
                    None => out.rejected += 1,
                },
                Event::Removed(r) => out.removed_blocks += self.remove(sub, r),
                Event::Cleared => {
                    self.drop_holders(sub);
                    if let Some(s) = self.subs.get_mut(&sub) {
                        s.engine = FxHashMap::default();
                    }
                    out.cleared += 1;
                }
            }
        }
        Some(out)
    }

    fn ns_id(&mut self, ns: &Namespace) -> u32 {
        if let Some(&id) = self.ns_ids.get(ns) {
            return id;
        }
        let id = self.tables.len() as u32;
        self.tables.push(Table::default());
        self.ns_ids.insert(ns.clone(), id);
        id
    }

    /// The namespace an event of `sub` lands in.
    fn event_ns(&mut self, sub: SubId, s: &Stored) -> u32 {
        let info = &self.subs[&sub].info;
        if s.lora.is_none()
            && s.salt.is_none()
            && s.tenant
                .as_deref()
                .is_none_or(|t| t == info.namespace.tenant)
        {
            return self.subs[&sub].default_ns;
        }
        let mut ns = info.namespace.clone();
        if let Some(l) = &s.lora {
            ns.lora.clone_from(l);
        }
        if let Some(salt) = &s.salt {
            ns.salt.clone_from(salt);
        }
        if let Some(t) = s.tenant.as_deref().filter(|t| !t.is_empty()) {
            ns.tenant = t.to_string();
        }
        let id = self.ns_id(&ns);
        let touched = &mut self.subs.get_mut(&sub).expect("registered").touched;
        if !touched.contains(&id) {
            touched.push(id);
        }
        id
    }

    /// Blocks stored, or `None` when the event cannot be placed.
    fn store(&mut self, sub: SubId, s: &Stored) -> Option<u64> {
        let bs = self.subs[&sub].info.namespace.block_size;
        if s.block_size.is_some_and(|b| b != bs) {
            return None;
        }
        let ns = self.event_ns(sub, s);
        let seed = self.seed;
        let placed: Vec<(u64, u32, u64)> = if s.tokens.is_empty() {
            // Hashes only: blocks this subscription stored before with their
            // tokens (a CPU offload of GPU blocks), else standard hashes.
            let engine = &self.subs[&sub].engine;
            s.hashes
                .iter()
                .map(|&h| match engine.get(&h) {
                    Some(&(n, std)) => (h, n, std),
                    None => (h, ns, h),
                })
                .collect()
        } else {
            if bs == 0 || s.tokens.len() != s.hashes.len() * bs as usize {
                return None;
            }
            // A parent is one of this publisher's blocks, or a block already
            // indexed under the standard; any other parent cannot be placed.
            let parent = match s.parent {
                None => None,
                Some(p) => match self.subs[&sub].engine.get(&p) {
                    Some(&(_, std)) => Some(std),
                    None if self.tables[ns as usize].blocks.contains_key(&p) => Some(p),
                    None => return None,
                },
            };
            let std = hash::seq_hashes_from(parent, &s.tokens, bs as usize, seed);
            s.hashes
                .iter()
                .zip(std)
                .map(|(&h, std)| (h, ns, std))
                .collect()
        };
        let bit = s.medium.bit();
        for &(engine_hash, n, std) in &placed {
            let holders = self.tables[n as usize]
                .blocks
                .entry(std)
                .or_insert_with(|| {
                    self.blocks += 1;
                    Holders::default()
                });
            match holders.get_mut(sub) {
                Some(h) => {
                    h.media |= bit;
                    h.stale &= !bit;
                }
                None => holders.push(Holder {
                    sub,
                    media: bit,
                    stale: 0,
                }),
            }
            if engine_hash != std {
                self.subs
                    .get_mut(&sub)
                    .expect("registered")
                    .engine
                    .insert(engine_hash, (n, std));
            }
        }
        Some(placed.len() as u64)
    }

    fn remove(&mut self, sub: SubId, r: &Removed) -> u64 {
        let mut default_ns = self.subs[&sub].default_ns;
        if let Some(t) = r.tenant.as_deref().filter(|t| !t.is_empty()) {
            let mut ns = self.subs[&sub].info.namespace.clone();
            if ns.tenant != t {
                ns.tenant = t.to_string();
                match self.ns_ids.get(&ns) {
                    Some(&id) => default_ns = id,
                    None => return 0,
                }
            }
        }
        let bit = r.medium.bit();
        let mut n = 0;
        for &h in &r.hashes {
            let (ns, std) = self.subs[&sub]
                .engine
                .get(&h)
                .copied()
                .unwrap_or((default_ns, h));
            let table = &mut self.tables[ns as usize];
            let Some(holders) = table.blocks.get_mut(&std) else {
                continue;
            };
            let Some(holder) = holders.get_mut(sub) else {
                continue;
            };
            if holder.media & bit == 0 {
                continue;
            }
            holder.media &= !bit;
            holder.stale &= !bit;
            n += 1;
            if holder.media == 0 {
                holders.remove(sub);
                if holders.is_empty() {
                    table.blocks.remove(&std);
                    self.blocks -= 1;
                }
                self.subs
                    .get_mut(&sub)
                    .expect("registered")
                    .engine
                    .remove(&h);
            }
        }
        n
    }

    fn drop_holders(&mut self, sub: SubId) {
        let touched = self.subs[&sub].touched.clone();
        for ns in touched {
            let table = &mut self.tables[ns as usize];
            let before = table.blocks.len();
            table.blocks.retain(|_, holders| {
                holders.remove(sub);
                !holders.is_empty()
            });
            self.blocks -= before - table.blocks.len();
        }
    }

    /// The hit counts, in blocks, of every instance registered for `ns`'s
    /// tenant and model (or `instance` alone), for the prompt whose rolling
    /// hashes are `hashes`. Each instance's walk stops at the first block
    /// none of its media holds; its per-medium and per-rank counts count
    /// every block of that prefix held there.
    pub fn query(
        &self,
        ns: &Namespace,
        instance: Option<&str>,
        hashes: &[u64],
    ) -> BTreeMap<String, InstanceHit> {
        let ns_id = self.ns_ids.get(ns).copied();
        let mut names: Vec<&str> = Vec::new();
        let mut answers: Vec<InstanceHit> = Vec::new();
        // sub → (instance slot, device rank if it reports one)
        let mut cand: FxHashMap<SubId, (usize, Option<u32>)> = FxHashMap::default();
        let mut subs: Vec<(&SubId, &Sub)> = self.subs.iter().collect();
        subs.sort_by_key(|(id, _)| **id);
        for (&id, s) in subs {
            let i = &s.info;
            let registered_here = i.namespace.tenant == ns.tenant
                && i.namespace.model == ns.model
                && i.namespace.block_size == ns.block_size;
            let holds_here = ns_id.is_some_and(|n| s.touched.contains(&n));
            if !(registered_here || holds_here)
                || instance.is_some_and(|want| want != i.instance_id)
            {
                continue;
            }
            let slot = match names.iter().position(|n| *n == i.instance_id) {
                Some(p) => p,
                None => {
                    names.push(&i.instance_id);
                    answers.push(InstanceHit::default());
                    names.len() - 1
                }
            };
            let rank = (i.kind != Kind::Mooncake).then_some(i.dp_rank);
            if let Some(r) = rank {
                answers[slot].dp.entry(r).or_insert(0);
            }
            cand.insert(id, (slot, rank));
        }
        if let Some(table) = ns_id.map(|n| &self.tables[n as usize]) {
            let mut alive = vec![true; names.len()];
            let mut live = names.len();
            let mut media = vec![0u8; names.len()];
            let mut ranks: Vec<(usize, u32)> = Vec::new();
            for h in hashes {
                if live == 0 {
                    break;
                }
                let Some(holders) = table.blocks.get(h) else {
                    break;
                };
                media.iter_mut().for_each(|m| *m = 0);
                ranks.clear();
                for holder in holders.iter() {
                    let Some(&(slot, rank)) = cand.get(&holder.sub) else {
                        continue;
                    };
                    let held = holder.media & !holder.stale;
                    media[slot] |= held;
                    if let (Some(r), true) = (rank, held & Medium::Gpu.bit() != 0) {
                        if !ranks.contains(&(slot, r)) {
                            ranks.push((slot, r));
                        }
                    }
                }
                for slot in 0..names.len() {
                    if !alive[slot] {
                        continue;
                    }
                    let m = media[slot];
                    if m == 0 {
                        alive[slot] = false;
                        live -= 1;
                        continue;
                    }
                    let a = &mut answers[slot];
                    a.longest_matched += 1;
                    a.gpu += u64::from(m & Medium::Gpu.bit() != 0);
                    a.cpu += u64::from(m & Medium::Cpu.bit() != 0);
                    a.disk += u64::from(m & Medium::Disk.bit() != 0);
                }
                for &(slot, r) in &ranks {
                    if alive[slot] {
                        *answers[slot].dp.entry(r).or_insert(0) += 1;
                    }
                }
            }
        }
        names.into_iter().map(String::from).zip(answers).collect()
    }

    /// The standard rolling hashes of a prompt's complete blocks.
    pub fn prompt_hashes(&self, tokens: &[u32], block_size: u32) -> Vec<u64> {
        hash::seq_hashes(tokens, block_size as usize, self.seed)
    }

    /// An estimate of the heap the index uses: the hash tables' slots (key,
    /// value, control byte) at their capacity, and holders lists that
    /// spilled to the heap.
    pub fn approx_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, Holders)>() + 1;
        let eslot = std::mem::size_of::<(u64, (u32, u64))>() + 1;
        let tables: usize = self
            .tables
            .iter()
            .map(|t| {
                t.blocks.capacity() * slot
                    + t.blocks.values().map(Holders::heap_bytes).sum::<usize>()
            })
            .sum();
        let engine: usize = self
            .subs
            .values()
            .map(|s| s.engine.capacity() * eslot)
            .sum();
        tables + engine
    }
}

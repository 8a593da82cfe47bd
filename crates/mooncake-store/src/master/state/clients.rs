//! Client liveness: which clients the master knows and when each was last
//! heard from (a heartbeat or a mount). A client's segments are those the
//! segment table says it owns; what expiry takes with it (its segments, the
//! replicas there, its puts in flight) the service composes.

use std::collections::HashMap;

use crate::types::ClientId;

/// The known clients and their last contact (ms). Last contact is
/// volatile: heartbeats change it on the leader only; registration and
/// expiry are mutations.
#[derive(Debug, Default)]
pub(crate) struct ClientTable {
    last_seen: HashMap<ClientId, u64>,
}

impl ClientTable {
    /// Notes contact from a known client; false when it is unknown.
    pub(crate) fn touch(&mut self, client: ClientId, now: u64) -> bool {
        match self.last_seen.get_mut(&client) {
            Some(t) => {
                *t = now;
                true
            }
            None => false,
        }
    }

    /// Notes contact from every known client (a new leader gives each a
    /// full TTL to reach it).
    pub(crate) fn touch_all(&mut self, now: u64) {
        for t in self.last_seen.values_mut() {
            *t = (*t).max(now);
        }
    }

    pub(crate) fn insert(&mut self, client: ClientId, now: u64) {
        self.last_seen.insert(client, now);
    }

    pub(crate) fn remove(&mut self, client: ClientId) -> bool {
        self.last_seen.remove(&client).is_some()
    }

    pub(crate) fn contains(&self, client: ClientId) -> bool {
        self.last_seen.contains_key(&client)
    }

    /// Clients not heard from for `ttl` at `now`.
    pub(crate) fn silent(&self, ttl: u64, now: u64) -> Vec<ClientId> {
        self.last_seen
            .iter()
            .filter(|(_, &t)| t.saturating_add(ttl) <= now)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Every known client and its last contact.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ClientId, u64)> + '_ {
        self.last_seen.iter().map(|(&c, &t)| (c, t))
    }

    pub(crate) fn len(&self) -> usize {
        self.last_seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_measured_from_the_last_contact() {
        let mut t = ClientTable::default();
        assert!(!t.touch(1, 0), "unknown clients are not touched");
        t.insert(1, 0);
        t.insert(2, 0);
        assert!(t.touch(2, 50));
        assert_eq!(t.silent(100, 99), Vec::<ClientId>::new());
        assert_eq!(t.silent(100, 100), [1]);
        assert!(t.remove(1) && !t.remove(1));
        assert_eq!((t.len(), t.contains(2)), (1, true));
    }
}

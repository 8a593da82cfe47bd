//! Client liveness: which clients the master knows and when each was last
//! heard from (a heartbeat or a mount). A client's segments are those the
//! segment table says it owns; what expiry takes with it (its segments, the
//! replicas there, its puts in flight) the service composes.
//!
//! Between alive and expired a client may be Suspected ([`health`]): silent
//! for `suspect_after` but not yet for the TTL. Nothing is dropped then;
//! reads only prefer other replicas to its own, so a stalled process does
//! not hold up readers for a whole TTL. Suspicion is derived from the last
//! contact and the time, never logged: it ends with the next heartbeat.

use std::collections::HashMap;

use crate::types::ClientId;

/// The known clients and their last contact (ms). Last contact is
/// volatile: heartbeats change it on the leader only; registration and
/// expiry are mutations.
#[derive(Debug, Default)]
pub(crate) struct ClientTable {
    last_seen: HashMap<ClientId, u64>,
    /// Silence after which a client is Suspected (0: never).
    suspect_after: u64,
}

/// Where a client stands at some time, by how long it has been silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    Alive,
    /// Missed heartbeats: its replicas are read only when no other is left.
    Suspected,
    /// Silent for the TTL: expired at the next tick.
    Offline,
}

/// The health of a client last heard from at `last_seen`, at `now`, when
/// silence of `suspect_after` (0: never) makes it Suspected and of `ttl`
/// Offline.
pub(crate) fn health(last_seen: u64, now: u64, suspect_after: u64, ttl: u64) -> Health {
    let silent = now.saturating_sub(last_seen);
    if silent >= ttl {
        Health::Offline
    } else if suspect_after > 0 && silent >= suspect_after {
        Health::Suspected
    } else {
        Health::Alive
    }
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

    pub(crate) fn set_suspect_after(&mut self, ms: u64) {
        self.suspect_after = ms;
    }

    /// Clients Suspected at `now` under a TTL of `ttl`.
    pub(crate) fn suspected(&self, ttl: u64, now: u64) -> Vec<ClientId> {
        self.last_seen
            .iter()
            .filter(|(_, &t)| health(t, now, self.suspect_after, ttl) == Health::Suspected)
            .map(|(&id, _)| id)
            .collect()
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

    #[test]
    fn a_silent_client_is_suspected_before_it_is_offline() {
        // Heartbeats every 500 ms; Suspected after 2 s, Offline after 10 s.
        let h = |last, now| health(last, now, 2_000, 10_000);
        assert_eq!(h(0, 0), Health::Alive);
        assert_eq!(h(0, 1_999), Health::Alive);
        assert_eq!(h(0, 2_000), Health::Suspected);
        assert_eq!(h(0, 9_999), Health::Suspected);
        assert_eq!(h(0, 10_000), Health::Offline);
        // A heartbeat ends the suspicion.
        assert_eq!(h(9_000, 9_999), Health::Alive);
        // Off: alive until offline.
        assert_eq!(health(0, 9_999, 0, 10_000), Health::Alive);
        assert_eq!(health(0, 10_000, 0, 10_000), Health::Offline);
        // Suspecting later than the TTL never suspects.
        assert_eq!(health(0, 10_000, 20_000, 10_000), Health::Offline);

        let mut t = ClientTable::default();
        t.set_suspect_after(2_000);
        t.insert(1, 0);
        t.insert(2, 0);
        assert!(t.touch(2, 1_500));
        assert_eq!(t.suspected(10_000, 1_999), Vec::<ClientId>::new());
        assert_eq!(t.suspected(10_000, 2_000), [1]);
        assert!(t.touch(1, 3_000));
        assert_eq!(t.suspected(10_000, 3_600), [2]);
        assert_eq!(
            t.suspected(10_000, 20_000),
            Vec::<ClientId>::new(),
            "offline, not suspected"
        );
    }
}

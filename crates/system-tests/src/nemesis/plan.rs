//! The faults of a run, drawn from its seed: the same seed and kinds give
//! the same faults in the same order (pure, no clock).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which master a fault hits, picked when the fault is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Leader,
    /// The first (0) or second (1) standby, by port order.
    Standby(usize),
}

/// The kinds of fault, as counted in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `kill -9`, then a restart on the same ports and directories.
    Kill,
    /// SIGSTOP, SIGCONT after the fault's duration.
    Pause,
    /// The master's connections to the coordination service carry nothing
    /// for the fault's duration.
    Partition,
    /// etcd or redis killed and restarted on its data (the harness's own);
    /// on the Lease stand-in, the API holds every request unanswered.
    Coordination,
    /// The file system of the master's log full for the fault's duration.
    DiskFull,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Kill,
        Kind::Pause,
        Kind::Partition,
        Kind::Coordination,
        Kind::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill9",
            Kind::Pause => "pause",
            Kind::Partition => "partition",
            Kind::Coordination => "coordination",
            Kind::DiskFull => "disk_full",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: Kind,
    pub target: Target,
    /// How long it lasts (a kill: how long the master stays down).
    pub lasts: Duration,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match self.target {
            Target::Leader => "the leader".to_string(),
            Target::Standby(i) => format!("standby {i}"),
        };
        match self.kind {
            Kind::Coordination => write!(f, "coordination service out for {:?}", self.lasts),
            k => write!(f, "{} of {who} for {:?}", k.name(), self.lasts),
        }
    }
}

/// The faults of a run, drawn one by one from the seed.
pub struct Plan {
    rng: StdRng,
    kinds: Vec<Kind>,
}

impl Plan {
    /// Faults of `kinds` (not empty) drawn from `seed`.
    pub fn new(seed: u64, kinds: &[Kind]) -> Plan {
        assert!(!kinds.is_empty(), "a plan needs a kind of fault");
        Plan {
            rng: StdRng::seed_from_u64(seed),
            kinds: kinds.to_vec(),
        }
    }

    pub fn next_fault(&mut self) -> Fault {
        let kind = self.kinds[self.rng.gen_range(0..self.kinds.len())];
        // Half the faults hit the leader: that is where they cost most.
        let target = if self.rng.gen_bool(0.5) {
            Target::Leader
        } else {
            Target::Standby(self.rng.gen_range(0..2))
        };
        let lasts = match kind {
            // Down for up to 2 s: sometimes back before anyone noticed.
            Kind::Kill => Duration::from_millis(self.rng.gen_range(0..=2000)),
            _ => Duration::from_millis(self.rng.gen_range(1000..=6000)),
        };
        Fault {
            kind,
            target,
            lasts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_faults_in_the_same_order() {
        let draw = |seed| {
            let mut p = Plan::new(seed, &Kind::ALL);
            (0..50).map(|_| p.next_fault()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn every_kind_and_target_comes_up_within_its_bounds() {
        let mut p = Plan::new(1, &Kind::ALL);
        let faults: Vec<Fault> = (0..1000).map(|_| p.next_fault()).collect();
        for k in Kind::ALL {
            assert!(faults.iter().any(|f| f.kind == k), "{k:?} never drawn");
        }
        for t in [Target::Leader, Target::Standby(0), Target::Standby(1)] {
            assert!(faults.iter().any(|f| f.target == t), "{t:?} never drawn");
        }
        for f in &faults {
            let ms = f.lasts.as_millis();
            match f.kind {
                Kind::Kill => assert!(ms <= 2000, "{f}"),
                _ => assert!((1000..=6000).contains(&ms), "{f}"),
            }
        }
    }

    #[test]
    fn only_the_kinds_asked_for_are_drawn() {
        let mut p = Plan::new(3, &[Kind::Pause, Kind::Kill]);
        for _ in 0..200 {
            let f = p.next_fault();
            assert!(matches!(f.kind, Kind::Pause | Kind::Kill), "{f}");
        }
    }
}

//! Membership arithmetic of an elastic group, without I/O: the size a rank
//! reports, and how the active ranks agree on ranks to activate.
//!
//! Activation is decided by the active ranks together: each contributes a
//! vote (what it was asked to activate, and which of those it sees ready),
//! one element-wise MAX all-reduce combines the votes, and every rank
//! decides the same from the combined vote.

use std::collections::BTreeSet;

/// The world size a rank reports. A joining rank that is not active yet
/// runs alone but reports the size it declared (torch checks ranks against
/// it before the rank can join); an active rank reports the extent of the
/// active rank space, one past the highest active rank, so gaps left by
/// dead ranks keep the others' numbers.
pub fn visible_size(active: &[usize], declared: usize, joined: bool) -> usize {
    match active.iter().max() {
        Some(&top) if joined => top + 1,
        _ => declared,
    }
}

/// Checks the ranks of a proposal: in range, no duplicate, not empty.
/// Returns them sorted.
pub fn check_ranks(max_group_size: usize, ranks: &[i64]) -> Result<Vec<usize>, String> {
    if ranks.is_empty() {
        return Err("no rank given".into());
    }
    let mut seen = BTreeSet::new();
    for &r in ranks {
        if r < 0 || r as u64 >= max_group_size as u64 {
            return Err(format!(
                "rank {r} out of valid range (max_group_size {max_group_size})"
            ));
        }
        if !seen.insert(r as usize) {
            return Err(format!("rank {r} given twice"));
        }
    }
    Ok(seen.into_iter().collect())
}

/// Checks an activation proposal against this rank's active set, before
/// any vote: every active rank holds the same set, so each refuses alike
/// without a collective. Returns the ranks sorted.
pub fn check_activation(
    max_group_size: usize,
    active: &[usize],
    ranks: &[i64],
) -> Result<Vec<usize>, String> {
    let want = check_ranks(max_group_size, ranks)?;
    let already: Vec<usize> = want
        .iter()
        .copied()
        .filter(|r| active.contains(r))
        .collect();
    if !already.is_empty() {
        return Err(format!(
            "ranks {already:?} are active already: a rank is not an inactive member"
        ));
    }
    Ok(want)
}

/// This rank's vote on activating `requested`, of which `ready` are
/// published by a live process it has mapped: three blocks of
/// `max_group_size` entries whose element-wise MAX over the voters gives
/// the union of the requests, minus their intersection, and minus "ready
/// everywhere".
pub fn activation_vote(max_group_size: usize, requested: &[usize], ready: &[usize]) -> Vec<i64> {
    let n = max_group_size;
    let mut v = vec![0i64; 3 * n];
    for &r in requested.iter().filter(|&&r| r < n) {
        v[r] = 1;
        v[n + r] = -1;
        v[2 * n + r] = if ready.contains(&r) { -1 } else { 0 };
    }
    v
}

/// What an activation proposal comes to, the same on every active rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activation {
    Rejected(String),
    /// `add` join the active set (which becomes `active`); `dropped`
    /// were asked for but are not ready on every active rank.
    Apply {
        active: Vec<usize>,
        add: Vec<usize>,
        dropped: Vec<usize>,
    },
}

/// Decides an activation from the combined vote (see [`activation_vote`])
/// and the active set before it.
pub fn decide_activation(max_group_size: usize, active: &[usize], vote: &[i64]) -> Activation {
    let n = max_group_size;
    if vote.len() != 3 * n {
        return Activation::Rejected(format!(
            "a vote of {} entries for a group of {n}",
            vote.len()
        ));
    }
    let union: Vec<usize> = (0..n).filter(|&r| vote[r] > 0).collect();
    let everywhere: Vec<usize> = (0..n).filter(|&r| vote[n + r] < 0).collect();
    if union != everywhere {
        return Activation::Rejected(format!(
            "the active ranks proposed different ranks to activate ({union:?} in all, \
             {everywhere:?} by every one)"
        ));
    }
    if union.is_empty() {
        return Activation::Rejected("no rank given".into());
    }
    let already: Vec<usize> = union
        .iter()
        .copied()
        .filter(|r| active.contains(r))
        .collect();
    if !already.is_empty() {
        return Activation::Rejected(format!(
            "ranks {already:?} are active already: a rank is not an inactive member"
        ));
    }
    let (add, dropped): (Vec<usize>, Vec<usize>) =
        union.iter().copied().partition(|&r| vote[2 * n + r] < 0);
    if add.is_empty() {
        return Activation::Rejected(format!(
            "ranks {dropped:?} are not ready: no live process has published them \
             (start it with is_extension=True)"
        ));
    }
    let mut all: BTreeSet<usize> = active.iter().copied().collect();
    all.extend(add.iter().copied());
    Activation::Apply {
        active: all.into_iter().collect(),
        add,
        dropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn combine(votes: &[Vec<i64>]) -> Vec<i64> {
        let mut out = votes[0].clone();
        for v in &votes[1..] {
            for (o, x) in out.iter_mut().zip(v) {
                *o = (*o).max(*x);
            }
        }
        out
    }

    #[test]
    fn the_reported_size_is_the_active_extent_once_joined() {
        assert_eq!(visible_size(&[0, 1, 2], 3, true), 3);
        assert_eq!(visible_size(&[0, 1, 2, 3], 3, true), 4);
        // A dead rank in the middle keeps the others' numbers.
        assert_eq!(visible_size(&[0, 2, 3], 4, true), 4);
        assert_eq!(visible_size(&[0, 1, 2], 4, true), 3);
        // A joiner alone reports what it declared.
        assert_eq!(visible_size(&[2], 4, false), 4);
        assert_eq!(visible_size(&[], 4, true), 4);
    }

    #[test]
    fn bad_proposals_are_refused_before_any_vote() {
        assert!(check_ranks(4, &[]).is_err());
        assert!(check_ranks(4, &[4])
            .unwrap_err()
            .contains("out of valid range"));
        assert!(check_ranks(4, &[-1]).is_err());
        assert!(check_ranks(4, &[1, 1]).unwrap_err().contains("twice"));
        assert_eq!(check_ranks(4, &[3, 1]).unwrap(), vec![1, 3]);
    }

    #[test]
    fn activating_an_active_rank_is_refused_without_a_vote() {
        assert!(check_activation(4, &[0, 1, 2, 3], &[3])
            .unwrap_err()
            .contains("active already"));
        assert!(check_activation(4, &[0, 1], &[4]).is_err());
        assert_eq!(check_activation(4, &[0, 1], &[3, 2]).unwrap(), vec![2, 3]);
    }

    #[test]
    fn agreeing_ranks_activate_the_ready_ones() {
        let v = combine(&[
            activation_vote(4, &[3], &[3]),
            activation_vote(4, &[3], &[3]),
            activation_vote(4, &[3], &[3]),
        ]);
        assert_eq!(
            decide_activation(4, &[0, 1, 2], &v),
            Activation::Apply {
                active: vec![0, 1, 2, 3],
                add: vec![3],
                dropped: vec![]
            }
        );
    }

    #[test]
    fn a_rank_not_ready_everywhere_is_dropped() {
        let v = combine(&[
            activation_vote(4, &[2, 3], &[2, 3]),
            activation_vote(4, &[2, 3], &[2]),
        ]);
        assert_eq!(
            decide_activation(4, &[0, 1], &v),
            Activation::Apply {
                active: vec![0, 1, 2],
                add: vec![2],
                dropped: vec![3]
            }
        );
        let v = combine(&[
            activation_vote(4, &[3], &[]),
            activation_vote(4, &[3], &[3]),
        ]);
        assert!(
            matches!(decide_activation(4, &[0, 1], &v), Activation::Rejected(r) if r.contains("not ready"))
        );
    }

    #[test]
    fn disagreement_or_an_active_rank_is_rejected() {
        let v = combine(&[
            activation_vote(4, &[2], &[2]),
            activation_vote(4, &[3], &[3]),
        ]);
        assert!(
            matches!(decide_activation(4, &[0, 1], &v), Activation::Rejected(r) if r.contains("different"))
        );
        let v = combine(&[
            activation_vote(4, &[1], &[1]),
            activation_vote(4, &[1], &[1]),
        ]);
        assert!(
            matches!(decide_activation(4, &[0, 1], &v), Activation::Rejected(r) if r.contains("active already"))
        );
        assert!(matches!(
            decide_activation(4, &[0], &[0; 5]),
            Activation::Rejected(_)
        ));
        assert!(
            matches!(decide_activation(4, &[0], &[0; 12]), Activation::Rejected(r) if r.contains("no rank"))
        );
    }

    #[test]
    fn a_lone_active_rank_decides_alone() {
        let v = activation_vote(2, &[1], &[1]);
        assert_eq!(
            decide_activation(2, &[0], &v),
            Activation::Apply {
                active: vec![0, 1],
                add: vec![1],
                dropped: vec![]
            }
        );
    }
}

//! The open-file limit of a serving process.
//!
//! A server holds a descriptor per connection (two in the RPC loop), and a
//! common soft limit is 1024 while the hard one is far higher. Servers raise
//! the soft limit to the hard one at start, as many servers do, so a storm
//! of connections meets their connection caps instead of failed `accept`s.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; the soft limit now in
/// force (`None` when it cannot be read).
pub fn raise_to_hard() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    Some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let soft = raise_to_hard().expect("readable");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes a local struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(soft, lim.rlim_cur);
    }
}

//! glibc allocator thresholds, set by each process for its own workload.
//!
//! glibc serves blocks above its mmap threshold from `mmap` and gives them
//! back on free; below it, from the heap, whose free top goes back to the
//! kernel only past the trim threshold. Both are dynamic by default: the
//! first free of an mmapped block raises the mmap threshold to its size.
//! Setting them by hand fixes them. A process opts out with
//! `MC_MALLOC_TUNING=0`, or by setting glibc's own `MALLOC_MMAP_THRESHOLD_` /
//! `MALLOC_TRIM_THRESHOLD_`, which then win.

/// Fixed allocator thresholds (bytes); `None` leaves that one dynamic.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub mmap: Option<usize>,
    pub trim: Option<usize>,
}

/// Applies `t` unless the environment opts out (see the module docs).
/// Returns whether it did. No effect off glibc.
pub fn tune(t: Thresholds) -> bool {
    let opted_out = opted_out(|name| std::env::var_os(name));
    if opted_out {
        return false;
    }
    apply(t)
}

fn opted_out(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    var("MC_MALLOC_TUNING").is_some_and(|v| v == "0")
        || var("MALLOC_MMAP_THRESHOLD_").is_some()
        || var("MALLOC_TRIM_THRESHOLD_").is_some()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply(t: Thresholds) -> bool {
    let c_int = |v: usize| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only changes allocator parameters; it is safe to call
    // at any time, from any thread.
    unsafe {
        if let Some(v) = t.mmap {
            libc::mallopt(libc::M_MMAP_THRESHOLD, c_int(v));
        }
        if let Some(v) = t.trim {
            libc::mallopt(libc::M_TRIM_THRESHOLD, c_int(v));
        }
    }
    true
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply(_: Thresholds) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn environment_opts_out() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert!(!opted_out(env(&[])));
        assert!(!opted_out(env(&[("MC_MALLOC_TUNING", "1")])));
        assert!(opted_out(env(&[("MC_MALLOC_TUNING", "0")])));
        assert!(opted_out(env(&[("MALLOC_MMAP_THRESHOLD_", "65536")])));
        assert!(opted_out(env(&[("MALLOC_TRIM_THRESHOLD_", "0")])));
    }
}

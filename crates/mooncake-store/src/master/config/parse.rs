//! Value parsers of the flag table: `(flag name, value as given, value
//! trimmed)` in, the field's value or an `INVALID_PARAMS` naming the flag out.

use std::time::Duration;

use mooncake_common::duration::parse_duration;
use mooncake_common::gflags::parse_bool;
use mooncake_common::{Error, ErrorCode, Result};

use crate::master::config::policy::{AllocationStrategy, EvictionPolicy, HotKeyMode};

/// The error for a value `name` does not take.
pub(super) fn invalid(name: &str, value: &str, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!("invalid value {value:?} for {name}: {why}"),
    )
}

pub(super) fn boolean(name: &str, value: &str, v: &str) -> Result<bool> {
    parse_bool(v).map_err(|e| invalid(name, value, e))
}

pub(super) fn size(name: &str, value: &str, v: &str) -> Result<u64> {
    mooncake_common::size::parse_size(v).map_err(|e| invalid(name, value, e.context))
}

pub(super) fn count(name: &str, value: &str, v: &str) -> Result<usize> {
    let n = v.parse::<u64>().map_err(|e| invalid(name, value, e))?;
    Ok(n as usize)
}

pub(super) fn port(name: &str, value: &str, v: &str) -> Result<u16> {
    v.parse::<u16>().map_err(|e| invalid(name, value, e))
}

pub(super) fn ratio(name: &str, value: &str, v: &str) -> Result<f64> {
    let r: f64 = v.parse().map_err(|e| invalid(name, value, e))?;
    if !(0.0..=1.0).contains(&r) {
        return Err(invalid(name, value, "must be between 0 and 1"));
    }
    Ok(r)
}

pub(super) fn text(_: &str, _: &str, v: &str) -> Result<String> {
    Ok(v.to_string())
}

fn duration(name: &str, value: &str, v: &str, unit: Duration) -> Result<Duration> {
    parse_duration(v, unit).map_err(|e| invalid(name, value, e.context))
}

/// A duration, bare numbers in milliseconds.
pub(super) fn millis(name: &str, value: &str, v: &str) -> Result<Duration> {
    duration(name, value, v, Duration::from_millis(1))
}

/// A duration, bare numbers in seconds.
pub(super) fn seconds(name: &str, value: &str, v: &str) -> Result<Duration> {
    duration(name, value, v, Duration::from_secs(1))
}

/// Whole seconds (a Lease's `leaseDurationSeconds` is an integer), at least 1.
pub(super) fn whole_seconds(name: &str, value: &str, v: &str) -> Result<Duration> {
    let d = seconds(name, value, v)?;
    if d.is_zero() || d.subsec_nanos() != 0 {
        return Err(invalid(
            name,
            value,
            "must be a whole number of seconds, at least 1",
        ));
    }
    Ok(d)
}

pub(super) fn positive_seconds(name: &str, value: &str, v: &str) -> Result<Duration> {
    let d = seconds(name, value, v)?;
    if d.is_zero() {
        return Err(invalid(name, value, "must be positive"));
    }
    Ok(d)
}

/// Seconds, with 0 meaning never.
pub(super) fn seconds_or_never(name: &str, value: &str, v: &str) -> Result<Option<Duration>> {
    let d = seconds(name, value, v)?;
    Ok((!d.is_zero()).then_some(d))
}

pub(super) fn strategy(_: &str, _: &str, v: &str) -> Result<AllocationStrategy> {
    AllocationStrategy::parse(v)
}

pub(super) fn eviction_policy(_: &str, _: &str, v: &str) -> Result<EvictionPolicy> {
    EvictionPolicy::parse(v)
}

pub(super) fn offset_allocator(name: &str, value: &str, v: &str) -> Result<String> {
    if v != "offset" {
        return Err(invalid(
            name,
            value,
            "only the offset allocator is available",
        ));
    }
    Ok(v.to_string())
}

pub(super) fn positive_count(name: &str, value: &str, v: &str) -> Result<usize> {
    let n = count(name, value, v)?;
    if n == 0 {
        return Err(invalid(name, value, "must be positive"));
    }
    Ok(n)
}

pub(super) fn snapshot_store(name: &str, value: &str, v: &str) -> Result<String> {
    if !matches!(v, "" | "local" | "s3") {
        return Err(invalid(name, value, "snapshot stores are local and s3"));
    }
    Ok(v.to_string())
}

pub(super) fn ha_backend_type(name: &str, value: &str, v: &str) -> Result<String> {
    if !matches!(v, "etcd" | "redis" | "k8s") {
        return Err(invalid(name, value, "HA backends are etcd, redis and k8s"));
    }
    Ok(v.to_string())
}

pub(super) fn hot_key_mode(name: &str, value: &str, v: &str) -> Result<HotKeyMode> {
    HotKeyMode::parse(v).map_err(|e| invalid(name, value, e.context))
}

/// A whole number of seconds that fits 32 bits, as the reference's flag.
pub(super) fn u32_seconds(name: &str, value: &str, v: &str) -> Result<u64> {
    let n = v.parse::<u32>().map_err(|e| invalid(name, value, e))?;
    Ok(u64::from(n))
}

/// A finite number above zero.
pub(super) fn positive_float(name: &str, value: &str, v: &str) -> Result<f64> {
    let r: f64 = v.parse().map_err(|e| invalid(name, value, e))?;
    if !r.is_finite() || r <= 0.0 {
        return Err(invalid(name, value, "must be > 0"));
    }
    Ok(r)
}

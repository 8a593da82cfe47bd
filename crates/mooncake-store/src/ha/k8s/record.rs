//! The election's record in a Lease's spec, and client-go's
//! acquire-or-renew decision over it. Pure: the caller passes the clocks.
//!
//! Expiry of someone else's lease is judged, as client-go judges it, by
//! when this process last saw the record change (`observed`, monotonic),
//! never by comparing the remote `renewTime` with the local clock: clocks
//! of different machines need not agree. Only the client-side lookup
//! ([`holder_at`]) reads `renewTime`, as the reference's lookup does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use tokio::time::Instant;

/// client-go's LeaderElectionRecord, as a LeaseSpec carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// Empty: nobody holds the lease.
    pub holder: String,
    pub duration_secs: i64,
    /// MicroTime strings, compared as read (the record's identity).
    pub acquire_time: Option<String>,
    pub renew_time: Option<String>,
    /// Times the lease changed hands: the holder's term.
    pub transitions: i64,
}

impl LeaseRecord {
    pub fn from_spec(spec: Option<&Value>) -> LeaseRecord {
        let spec = spec.and_then(Value::as_object);
        let get = |k: &str| spec.and_then(|s| s.get(k));
        let text = |k: &str| get(k).and_then(Value::as_str).map(str::to_string);
        LeaseRecord {
            holder: text("holderIdentity").unwrap_or_default(),
            duration_secs: get("leaseDurationSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            acquire_time: text("acquireTime"),
            renew_time: text("renewTime"),
            transitions: get("leaseTransitions").and_then(Value::as_i64).unwrap_or(0),
        }
    }

    pub fn to_spec(&self) -> Value {
        let mut spec = Map::new();
        spec.insert("holderIdentity".into(), json!(self.holder));
        spec.insert("leaseDurationSeconds".into(), json!(self.duration_secs));
        if let Some(t) = &self.acquire_time {
            spec.insert("acquireTime".into(), json!(t));
        }
        if let Some(t) = &self.renew_time {
            spec.insert("renewTime".into(), json!(t));
        }
        spec.insert("leaseTransitions".into(), json!(self.transitions));
        Value::Object(spec)
    }

    /// A new holder's record: acquired and renewed now.
    pub fn acquired(holder: &str, duration_secs: i64, transitions: i64, now: SystemTime) -> Self {
        let t = Some(micro_time(now));
        LeaseRecord {
            holder: holder.to_string(),
            duration_secs,
            acquire_time: t.clone(),
            renew_time: t,
            transitions,
        }
    }

    /// The holder's next renewal: same acquisition, renewed now.
    pub fn renewed(&self, duration_secs: i64, now: SystemTime) -> Self {
        LeaseRecord {
            duration_secs,
            renew_time: Some(micro_time(now)),
            ..self.clone()
        }
    }

    /// What a resigning holder writes (client-go's release): no holder,
    /// a one-second lease, the term kept.
    pub fn released(&self, now: SystemTime) -> Self {
        let t = Some(micro_time(now));
        LeaseRecord {
            holder: String::new(),
            duration_secs: 1,
            acquire_time: t.clone(),
            renew_time: t,
            transitions: self.transitions,
        }
    }
}

/// When this process last saw a lease's record change.
#[derive(Debug, Clone)]
pub struct Observed {
    pub record: LeaseRecord,
    pub at: Instant,
}

/// A candidate's decision on a lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Someone holds it and it has not expired as observed here.
    Wait { holder: String },
    /// Free or expired: write this record (over the version read).
    Take(LeaseRecord),
}

/// client-go's tryAcquireOrRenew for a candidate that does not lead.
/// `observed` is updated when the record differs from the last one seen.
///
/// A lease held under `identity` itself is treated like anyone else's:
/// it is from an earlier run of this master, or from a second process
/// misconfigured with the same identity, and is taken only once expired.
pub fn decide(
    identity: &str,
    current: &LeaseRecord,
    observed: &mut Option<Observed>,
    now: Instant,
    wall: SystemTime,
    duration_secs: i64,
) -> Step {
    if observed.as_ref().map(|o| &o.record) != Some(current) {
        *observed = Some(Observed {
            record: current.clone(),
            at: now,
        });
    }
    let seen = observed.as_ref().unwrap().at;
    let lease = Duration::from_secs(current.duration_secs.max(0) as u64);
    let expired = seen + lease < now;
    if !current.holder.is_empty() && !expired {
        return Step::Wait {
            holder: current.holder.clone(),
        };
    }
    Step::Take(LeaseRecord::acquired(
        identity,
        duration_secs,
        current.transitions + 1,
        wall,
    ))
}

/// Whether a leader of term `term` still holds the lease it just read:
/// same identity and same term (a later holder always has a higher one).
pub fn still_ours(identity: &str, term: i64, current: &LeaseRecord) -> bool {
    current.holder == identity && current.transitions == term
}

/// The holder as a client looking for the leader sees it: none when the
/// holder is empty or its `renewTime + leaseDurationSeconds` has passed by
/// the local clock (the reference's lookup rule).
pub fn holder_at(record: &LeaseRecord, wall: SystemTime) -> Option<String> {
    if record.holder.is_empty() {
        return None;
    }
    if let Some(renewed) = record.renew_time.as_deref().and_then(parse_micro_time) {
        if record.duration_secs > 0 {
            let expiry = renewed + Duration::from_secs(record.duration_secs as u64);
            if wall > expiry {
                return None;
            }
        }
    }
    Some(record.holder.clone())
}

/// `metav1.MicroTime`: RFC 3339 in UTC with exactly six fractional digits,
/// the form the API server's Go layout demands.
pub fn micro_time(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Parses a MicroTime (or any RFC 3339 time with `Z` or an offset and up to
/// nine fractional digits: the server only ever writes six).
pub fn parse_micro_time(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = s.get(from..from + len)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (h, mi, sec) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || d > 31 || h > 23 || mi > 59 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = frac[..digits].parse::<u32>().ok()? * 10u32.pow(9 - digits as u32);
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        // `±hh:mm`, checked byte by byte: slicing a string that is not
        // ASCII at these offsets could split a character.
        tz => match tz.as_bytes() {
            &[sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]
                if [h1, h2, m1, m2].iter().all(u8::is_ascii_digit) =>
            {
                let digit = |c: u8| i64::from(c - b'0');
                let (oh, om) = (digit(h1) * 10 + digit(h2), digit(m1) * 10 + digit(m2));
                if oh > 23 || om > 59 {
                    return None;
                }
                let sign = if sign == b'-' { -1 } else { 1 };
                sign * (oh * 3600 + om * 60)
            }
            _ => return None,
        },
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, transitions: i64) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            duration_secs: 5,
            acquire_time: Some("2024-01-01T00:00:00.000000Z".into()),
            renew_time: Some("2024-01-01T00:00:00.000000Z".into()),
            transitions,
        }
    }

    #[test]
    fn micro_time_has_six_digits_in_utc() {
        let t = UNIX_EPOCH + Duration::from_nanos(1_709_251_199_123_456_789);
        assert_eq!(micro_time(t), "2024-02-29T23:59:59.123456Z");
        assert_eq!(micro_time(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            parse_micro_time("2024-02-29T23:59:59.123456Z"),
            Some(UNIX_EPOCH + Duration::from_micros(1_709_251_199_123_456))
        );
        assert_eq!(
            parse_micro_time("2024-03-01T01:59:59+02:00"),
            Some(UNIX_EPOCH + Duration::from_secs(1_709_251_199))
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-02-29T23:59:59",
            "2024-02-29T23:59:59.Z",
            "x024-02-29T23:59:59Z",
            // Offsets that are not `±hh:mm` in ASCII (a multibyte
            // character where a digit belongs must not split).
            "2024-02-29T23:59:59+0\u{2ff}30",
            "2024-02-29T23:59:59\u{2ff}00:0",
            "2024-02-29T23:59:59++1:00",
            "2024-02-29T23:59:59+24:00",
        ] {
            assert_eq!(parse_micro_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn spec_round_trip_and_missing_fields() {
        let r = held("a:1", 3);
        assert_eq!(LeaseRecord::from_spec(Some(&r.to_spec())), r);
        let empty = LeaseRecord::from_spec(Some(&json!({})));
        assert_eq!(empty, LeaseRecord::default());
        assert_eq!(LeaseRecord::from_spec(None), LeaseRecord::default());
    }

    #[test]
    fn a_held_lease_is_waited_for_until_it_expires_as_observed() {
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let mut observed = None;
        let other = held("b:1", 4);
        let wait = Step::Wait {
            holder: "b:1".into(),
        };
        assert_eq!(decide("a:1", &other, &mut observed, t0, wall, 5), wait);
        // The remote renewTime is years old, but expiry counts from when the
        // record was first seen here.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(decide("a:1", &other, &mut observed, later, wall, 5), wait);
        // A renewal seen restarts the count.
        let renewed = LeaseRecord {
            renew_time: Some("2024-01-01T00:00:01.000000Z".into()),
            ..other.clone()
        };
        assert_eq!(decide("a:1", &renewed, &mut observed, later, wall, 5), wait);
        let expired_at = later + Duration::from_millis(5001);
        match decide("a:1", &renewed, &mut observed, expired_at, wall, 7) {
            Step::Take(r) => {
                assert_eq!(r.holder, "a:1");
                assert_eq!(r.transitions, 5, "a new holder increments the term");
                assert_eq!(r.duration_secs, 7);
                assert_eq!(r.acquire_time, r.renew_time);
            }
            w => panic!("{w:?}"),
        }
    }

    #[test]
    fn a_released_lease_is_taken_at_once_with_the_next_term() {
        let mut observed = None;
        let released = held("b:1", 4).released(SystemTime::now());
        assert_eq!(released.holder, "");
        assert_eq!(released.transitions, 4);
        match decide(
            "a:1",
            &released,
            &mut observed,
            Instant::now(),
            SystemTime::now(),
            5,
        ) {
            Step::Take(r) => assert_eq!((r.holder.as_str(), r.transitions), ("a:1", 5)),
            w => panic!("{w:?}"),
        }
    }

    #[test]
    fn our_own_identity_from_elsewhere_is_not_ours() {
        let mut observed = None;
        let stale = held("a:1", 2);
        assert_eq!(
            decide(
                "a:1",
                &stale,
                &mut observed,
                Instant::now(),
                SystemTime::now(),
                5
            ),
            Step::Wait {
                holder: "a:1".into()
            }
        );
        assert!(still_ours("a:1", 2, &stale));
        assert!(!still_ours("a:1", 1, &stale));
        assert!(!still_ours("b:1", 2, &stale));
    }

    #[test]
    fn lookup_hides_a_holder_whose_renewal_ran_out() {
        let renewed = SystemTime::now() - Duration::from_secs(10);
        let mut r = LeaseRecord::acquired("a:1", 5, 0, renewed);
        assert_eq!(holder_at(&r, SystemTime::now()), None);
        assert_eq!(
            holder_at(&r, renewed + Duration::from_secs(4)),
            Some("a:1".into())
        );
        r.duration_secs = 15;
        assert_eq!(holder_at(&r, SystemTime::now()), Some("a:1".into()));
        r.holder.clear();
        assert_eq!(holder_at(&r, renewed), None);
        // No renewTime: the holder stands (nothing says it expired).
        assert_eq!(
            holder_at(
                &LeaseRecord {
                    holder: "a:1".into(),
                    ..Default::default()
                },
                SystemTime::now()
            ),
            Some("a:1".into())
        );
    }
}

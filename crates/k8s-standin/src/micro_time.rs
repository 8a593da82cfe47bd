//! `metav1.MicroTime` and `metav1.Time` as the API server reads and writes
//! them. MicroTime is parsed with Go's layout
//! `2006-01-02T15:04:05.000000Z07:00`, which demands exactly six fractional
//! digits, and is written back in UTC with six digits; Time is written to
//! the second.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Go's layout for MicroTime, quoted in decode errors as the server does.
pub const LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";

/// Microseconds since the Unix epoch, from a MicroTime string.
pub fn parse(s: &str) -> Result<i64, String> {
    let fail = |what: &str| format!("parsing time {s:?} as {LAYOUT:?}: {what}");
    let b = s.as_bytes();
    if b.len() < 27 {
        return Err(fail("too short"));
    }
    let num = |from: usize, len: usize| -> Result<i64, String> {
        let part = &s[from..from + len];
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(fail(&format!("cannot parse {part:?}")));
        }
        Ok(part.parse().unwrap())
    };
    for (at, sep) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ] {
        if b[at] != sep {
            return Err(fail(&format!("expected {:?} at {at}", sep as char)));
        }
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, min, sec) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let micros = num(20, 6)?;
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || min > 59
        || sec > 59
    {
        return Err(fail("out of range"));
    }
    let offset_secs = match &s[26..] {
        "Z" => 0,
        tz if tz.len() == 6 && (tz.starts_with('+') || tz.starts_with('-')) && &tz[3..4] == ":" => {
            let (h, m) = (num(27, 2)?, num(30, 2)?);
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        rest => return Err(fail(&format!("cannot parse {rest:?} as \"Z07:00\""))),
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec;
    Ok((secs - offset_secs) * 1_000_000 + micros)
}

/// A MicroTime string (UTC, six fractional digits).
pub fn format(micros: i64) -> String {
    let (secs, frac) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    format!("{}.{frac:06}Z", civil(secs))
}

/// A `metav1.Time` string (UTC, whole seconds).
pub fn format_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs() as i64;
    format!("{}Z", civil(secs))
}

fn civil(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_digits_round_trip_in_utc() {
        let t = parse("2024-02-29T23:59:59.123456Z").unwrap();
        assert_eq!(format(t), "2024-02-29T23:59:59.123456Z");
        assert_eq!(format(0), "1970-01-01T00:00:00.000000Z");
        // Offsets are normalised to UTC, as the server stores Local and writes UTC.
        assert_eq!(
            format(parse("2024-03-01T01:30:00.000001+02:00").unwrap()),
            "2024-02-29T23:30:00.000001Z"
        );
        assert_eq!(
            format(parse("1969-12-31T23:00:00.500000-01:00").unwrap()),
            "1970-01-01T00:00:00.500000Z"
        );
    }

    #[test]
    fn other_precisions_and_forms_are_rejected() {
        for bad in [
            "2024-01-01T00:00:00Z",
            "2024-01-01T00:00:00.123Z",
            "2024-01-01T00:00:00.1234567Z",
            "2024-01-01T00:00:00.123456",
            "2024-01-01 00:00:00.123456Z",
            "2024-13-01T00:00:00.123456Z",
            "2023-02-29T00:00:00.123456Z",
            "2024-01-01T00:00:00.123456+0200",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn time_is_whole_seconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_999);
        assert_eq!(format_time(t), "2023-11-14T22:13:20Z");
    }
}

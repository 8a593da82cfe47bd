//! Durations as the master's flags write them: a bare number in the flag's
//! default unit (`5000` ms for leases, `10` s for `client_ttl`), or with a
//! suffix: `100ms`, `5s`, `30m`, `1h`.

use std::time::Duration;

use crate::{Error, ErrorCode};

/// Parses `input`; a bare number is read in `default_unit`.
pub fn parse_duration(input: &str, default_unit: Duration) -> Result<Duration, Error> {
    let bad = |why: &str| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("invalid duration {input:?}: {why}"),
        )
    };
    let s = input.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad("not a number"))?;
    let unit = match unit.trim() {
        "" => default_unit,
        "us" => Duration::from_micros(1),
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" | "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86400),
        _ => return Err(bad("unknown unit")),
    };
    let n32 = u32::try_from(n).map_err(|_| bad("out of range"))?;
    unit.checked_mul(n32).ok_or_else(|| bad("out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("5000", MS).unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("5s", MS).unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_duration("30m", MS).unwrap(),
            Duration::from_secs(1800)
        );
        assert_eq!(parse_duration("1h", MS).unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration("100ms", MS).unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_duration("10", Duration::from_secs(1)).unwrap(),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "s", "-5", "5 parsecs", "1.5s"] {
            assert_eq!(
                parse_duration(s, MS).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{s:?}"
            );
        }
    }
}

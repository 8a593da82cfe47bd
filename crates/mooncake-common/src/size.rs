//! Byte sizes written the way Mooncake configs write them: `16777216`,
//! `"16MB"`, `"16 MB"`, `"3GB"`, `"1.5 GiB"`. Units are binary (1 KB = 1024 B),
//! matching the reference; percentages are rejected.

use crate::{Error, ErrorCode};

/// Parses a human-readable byte size.
pub fn parse_size(input: &str) -> Result<u64, Error> {
    let bad = |why: &str| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("invalid size {input:?}: {why}"),
        )
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    if s.contains('%') {
        return Err(bad("percentages are not supported"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(bad("no number"));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad("unknown unit")),
    };
    if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| bad("not a number"))?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(bad("out of range"));
        }
        Ok(bytes.round() as u64)
    } else {
        let v: u64 = num.parse().map_err(|_| bad("not a number"))?;
        v.checked_mul(mult).ok_or_else(|| bad("out of range"))
    }
}

/// Formats a byte count for logs, e.g. `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reference_forms() {
        assert_eq!(parse_size("16777216").unwrap(), 16 << 20);
        assert_eq!(parse_size("16MB").unwrap(), 16 << 20);
        assert_eq!(parse_size("16 MB").unwrap(), 16 << 20);
        assert_eq!(parse_size("3GB").unwrap(), 3 << 30);
        assert_eq!(parse_size("4 gb").unwrap(), 4 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("0").unwrap(), 0);
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "  ",
            "50%",
            "GB",
            "12XB",
            "-1",
            "1e3",
            "99999999999999999999999",
        ] {
            let e = parse_size(s).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{s:?}");
        }
        assert!(parse_size("20000000 TB").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(10), "10 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}

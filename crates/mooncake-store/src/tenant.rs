//! Tenants: their ids, how an object's tenant is part of its key in the
//! master's tables, the quota policy file and the effective quotas.
//!
//! Pure: no I/O besides the file helpers at the end, no clock.
//!
//! The master keys an object of tenant `t` other than `default` as
//! `t\0key` (as the reference scopes its keys); a `default` object keeps
//! its plain key, so a master without tenants, and every snapshot and log
//! written before tenants existed, hold `default` objects unchanged.

use std::borrow::Cow;
use std::collections::BTreeMap;

use mooncake_common::{Error, ErrorCode, Result};

/// The tenant of a client that names none.
pub const DEFAULT_TENANT: &str = "default";

/// Between a tenant and its key in a scoped key.
const SEPARATOR: char = '\0';

/// The largest quota and charge (`i64::MAX`, as the reference bounds them).
pub const MAX_QUOTA_BYTES: u64 = i64::MAX as u64;

/// Whether `id` may name a tenant: non-empty, not starting with `_`
/// (reserved), no control character.
pub fn is_valid(id: &str) -> bool {
    !id.is_empty() && !id.starts_with('_') && !id.bytes().any(|c| c < 0x20 || c == 0x7f)
}

/// The tenant a client names: empty means `default`.
pub fn normalize(id: &str) -> &str {
    if id.is_empty() {
        DEFAULT_TENANT
    } else {
        id
    }
}

/// The master's key for `key` of `tenant`.
pub fn scoped<'a>(tenant: &str, key: &'a str) -> Cow<'a, str> {
    if tenant == DEFAULT_TENANT {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{tenant}{SEPARATOR}{key}"))
    }
}

/// The tenant and the caller's key of a master key.
pub fn split(scoped: &str) -> (&str, &str) {
    match scoped.split_once(SEPARATOR) {
        Some((t, k)) => (t, k),
        None => (DEFAULT_TENANT, scoped),
    }
}

/// The tenant of a master key.
pub fn tenant_of(scoped: &str) -> &str {
    split(scoped).0
}

/// Whether a `default` key could be mistaken for another tenant's.
pub fn is_ambiguous(key: &str) -> bool {
    key.contains(SEPARATOR)
}

/// A quota as the policy file and the reference write it: an integer
/// with an optional unit `B`, `KB`, `MB`, `GB`, `TB` (1024-based).
pub fn parse_quota(value: &str) -> std::result::Result<u64, String> {
    let digits = value.bytes().take_while(u8::is_ascii_digit).count();
    if value.is_empty() {
        return Err("quota must not be empty".into());
    }
    if digits == 0 {
        return Err("quota must start with an integer".into());
    }
    let number: u64 = value[..digits]
        .parse()
        .map_err(|_| "quota integer overflows uint64".to_string())?;
    if number == 0 {
        return Err("quota must be positive".into());
    }
    let shift = match &value[digits..] {
        "" | "B" => 0,
        "KB" => 10,
        "MB" => 20,
        "GB" => 30,
        "TB" => 40,
        unit => return Err(format!("unsupported quota unit {unit:?}")),
    };
    let bytes = number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| "quota byte value overflows uint64".to_string())?;
    if bytes > MAX_QUOTA_BYTES {
        return Err("quota exceeds the largest tenant charge (2^63-1 bytes)".into());
    }
    Ok(bytes)
}

/// Requested quotas by tenant, as the policy file holds them.
pub type Policies = BTreeMap<String, u64>;

fn bad_policy(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!("tenant quota policy: {what}"),
    )
}

/// Reads a policy file's text: `version: 1` and `tenants: [{name, quota}]`.
pub fn parse_policies(text: &str) -> Result<Policies> {
    use serde_yaml::Value;
    let root: Value =
        serde_yaml::from_str(text).map_err(|e| bad_policy(format!("invalid YAML: {e}")))?;
    let Value::Mapping(root) = root else {
        return Err(bad_policy("must be a YAML map"));
    };
    let scalar = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    };
    match root.get("version").and_then(scalar) {
        None => return Err(bad_policy("version is required")),
        Some(v) if v.trim() == "1" => {}
        Some(v) => return Err(bad_policy(format!("unsupported version {v}"))),
    }
    let Some(Value::Sequence(tenants)) = root.get("tenants") else {
        return Err(bad_policy("tenants must be a YAML sequence"));
    };
    let mut out = Policies::new();
    for entry in tenants {
        let Value::Mapping(entry) = entry else {
            return Err(bad_policy("a tenant entry must be a YAML map"));
        };
        let name = entry
            .get("name")
            .and_then(scalar)
            .ok_or_else(|| bad_policy("a tenant name is required"))?;
        let quota = entry
            .get("quota")
            .and_then(scalar)
            .ok_or_else(|| bad_policy(format!("tenant {name:?}: quota is required")))?;
        if !is_valid(&name) {
            return Err(bad_policy(format!("invalid tenant name {name:?}")));
        }
        if out.contains_key(&name) {
            return Err(bad_policy(format!("duplicate tenant name {name:?}")));
        }
        let bytes = parse_quota(&quota)
            .map_err(|e| bad_policy(format!("invalid quota for tenant {name:?}: {e}")))?;
        out.insert(name, bytes);
    }
    Ok(out)
}

/// The policy file's text for `policies` (what an admin change writes).
pub fn format_policies(policies: &Policies) -> String {
    if policies.is_empty() {
        return "version: 1\n\ntenants: []\n".into();
    }
    let mut out = String::from("version: 1\n\ntenants:\n");
    for (name, quota) in policies {
        // A YAML double-quoted scalar: JSON's escapes are a subset.
        let quoted = serde_json::to_string(name).expect("a string serializes");
        out.push_str(&format!("  - name: {quoted}\n    quota: {quota}\n"));
    }
    out
}

/// Loads the policy file at `path`; a missing or bad file is an error.
pub fn load_policies(path: &std::path::Path) -> Result<Policies> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorCode::FILE_OPEN_FAIL,
            format!("tenant quota policy file {}: {e}", path.display()),
        )
    })?;
    parse_policies(&text).map_err(|e| e.with_context(path.display().to_string()))
}

/// Writes `policies` to `path` through a temporary file and a rename, so
/// a crash leaves the old file or the new one.
pub fn store_policies(path: &std::path::Path, policies: &Policies) -> Result<()> {
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorCode::FILE_WRITE_FAIL,
            format!("tenant quota policy file {}: {e}", path.display()),
        )
    };
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, format_policies(policies)).map_err(fail)?;
    let synced = std::fs::File::open(&tmp).and_then(|f| f.sync_all());
    synced
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            fail(e)
        })
}

/// Each tenant's effective quota: what it requested while the requests
/// fit `capacity` (the mounted bytes), else a share of `capacity` in
/// proportion to its request, the bytes left by rounding down going one
/// each to the largest remainders (ties by name).
pub fn effective_quotas(policies: &Policies, capacity: u64) -> BTreeMap<String, u64> {
    let sum: u128 = policies.values().map(|&q| u128::from(q)).sum();
    if sum <= u128::from(capacity) {
        return policies.clone();
    }
    let mut shares: Vec<(&String, u64, u128)> = policies
        .iter()
        .map(|(name, &q)| {
            let product = u128::from(capacity) * u128::from(q);
            (name, (product / sum) as u64, product % sum)
        })
        .collect();
    let assigned: u64 = shares.iter().map(|s| s.1).sum();
    let mut left = capacity - assigned;
    shares.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
    shares
        .into_iter()
        .map(|(name, base, _)| {
            let extra = u64::from(left > 0);
            left -= extra;
            (name.clone(), base + extra)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_scoped_keys() {
        assert!(is_valid("tenant-a") && is_valid("default") && is_valid("a b"));
        for bad in ["", "_x", "a\0b", "a\nb", "a\x7f"] {
            assert!(!is_valid(bad), "{bad:?}");
        }
        assert_eq!(normalize(""), "default");
        assert_eq!(scoped("default", "k"), "k");
        assert_eq!(scoped("t", "k"), "t\0k");
        assert_eq!(split("t\0k\0x"), ("t", "k\0x"));
        assert_eq!(split("k"), ("default", "k"));
        assert_eq!(tenant_of(&scoped("a", "b")), "a");
        assert!(is_ambiguous("x\0y") && !is_ambiguous("xy"));
    }

    #[test]
    fn quotas_parse_with_units() {
        assert_eq!(parse_quota("1"), Ok(1));
        assert_eq!(parse_quota("2B"), Ok(2));
        assert_eq!(parse_quota("3KB"), Ok(3 << 10));
        assert_eq!(parse_quota("4MB"), Ok(4 << 20));
        assert_eq!(parse_quota("5GB"), Ok(5 << 30));
        assert_eq!(parse_quota("6TB"), Ok(6 << 40));
        assert_eq!(parse_quota("9223372036854775807"), Ok(MAX_QUOTA_BYTES));
        for bad in [
            "",
            "0",
            "0GB",
            "1gb",
            "1kb",
            "1 GB",
            "GB",
            "-1",
            "1.5GB",
            "1PB",
            "9223372036854775808",
            "8388608TB",
            "99999999999999999999999",
        ] {
            assert!(parse_quota(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn policy_files_parse_and_round_trip() {
        let p = parse_policies(
            "version: 1\ntenants:\n  - name: a\n    quota: 2GB\n  - name: b\n    quota: 100\n",
        )
        .unwrap();
        assert_eq!(
            p,
            Policies::from([("a".into(), 2 << 30), ("b".into(), 100)])
        );
        assert_eq!(parse_policies(&format_policies(&p)).unwrap(), p);
        assert_eq!(
            parse_policies("version: 1\ntenants: []\n").unwrap(),
            Policies::new()
        );
        let odd = Policies::from([("we\"ird: name".into(), 5)]);
        assert_eq!(parse_policies(&format_policies(&odd)).unwrap(), odd);
        for bad in [
            "",
            "[]",
            "tenants: []",
            "version: 2\ntenants: []",
            "version: 1",
            "version: 1\ntenants: {}",
            "version: 1\ntenants: [x]",
            "version: 1\ntenants: [{quota: 1}]",
            "version: 1\ntenants: [{name: a}]",
            "version: 1\ntenants: [{name: '', quota: 1}]",
            "version: 1\ntenants: [{name: _a, quota: 1}]",
            "version: 1\ntenants: [{name: a, quota: 0}]",
            "version: 1\ntenants: [{name: a, quota: 1gb}]",
            "version: 1\ntenants: [{name: a, quota: 1}, {name: a, quota: 2}]",
            "version: 1\ntenants: [{name: \"a\\tb\", quota: 1}]",
            "version: [1\n",
        ] {
            let e = parse_policies(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad:?}");
        }
    }

    #[test]
    fn policy_files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.yaml");
        assert_eq!(
            load_policies(&path).unwrap_err().code,
            ErrorCode::FILE_OPEN_FAIL
        );
        let p = Policies::from([("a".into(), 7)]);
        store_policies(&path, &p).unwrap();
        assert_eq!(load_policies(&path).unwrap(), p);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn effective_quotas_share_what_is_mounted() {
        let p = Policies::from([("a".into(), 100), ("b".into(), 300)]);
        assert_eq!(
            effective_quotas(&p, 400),
            p,
            "requests that fit are granted"
        );
        assert_eq!(effective_quotas(&p, 1000), p);
        let zero = effective_quotas(&p, 0);
        assert_eq!(
            zero.values().sum::<u64>(),
            0,
            "nothing mounted, nothing granted"
        );
        let half = effective_quotas(&p, 200);
        assert_eq!(half, BTreeMap::from([("a".into(), 50), ("b".into(), 150)]));
        // 10 bytes over three equal requests: the remainder goes by name.
        let p3 = Policies::from([("a".into(), 5), ("b".into(), 5), ("c".into(), 5)]);
        let e = effective_quotas(&p3, 10);
        assert_eq!(
            e,
            BTreeMap::from([("a".into(), 4), ("b".into(), 3), ("c".into(), 3)])
        );
        let big = Policies::from([("a".into(), MAX_QUOTA_BYTES), ("b".into(), MAX_QUOTA_BYTES)]);
        let e = effective_quotas(&big, 1 << 62);
        assert_eq!(e.values().sum::<u64>(), 1 << 62);
    }
}

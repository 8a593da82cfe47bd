//! gflags-style command lines for the reference's binaries.
//!
//! Deployment scripts call `mooncake_master -rpc_port=50051 --enable_ha
//! --noenable_offload`. clap understands `--flag=value` and `--flag value`;
//! [`normalize`] rewrites the other gflags spellings into those, so each
//! binary can keep a plain clap derive struct.

/// Rewrites gflags spellings into clap's:
/// - `-name=value` and `-name value` (single dash, multi-letter) → `--name…`;
/// - `--noname` for a known boolean flag → `--name=false`;
/// - a bare boolean `--name` → `--name=true`.
///
/// `bool_flags` lists the boolean flags by name (without dashes). The first
/// element (the program name) and anything after `--` pass through unchanged.
pub fn normalize<I, S>(args: I, bool_flags: &[&str]) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut out = Vec::new();
    let mut passthrough = false;
    for (i, arg) in args.into_iter().map(Into::into).enumerate() {
        if i == 0 || passthrough {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        let body = if let Some(b) = arg.strip_prefix("--") {
            b
        } else if let Some(b) = arg.strip_prefix('-') {
            // `-x` single-letter short flags stay as they are (e.g. `-h`).
            if b.len() <= 1 || b.starts_with(|c: char| c.is_ascii_digit()) {
                out.push(arg);
                continue;
            }
            b
        } else {
            out.push(arg);
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let name = name.replace('-', "_");
        match value {
            Some(v) => out.push(format!("--{name}={v}")),
            None if bool_flags.contains(&name.as_str()) => out.push(format!("--{name}=true")),
            None => match name.strip_prefix("no") {
                Some(base) if bool_flags.contains(&base) => out.push(format!("--{base}=false")),
                _ => out.push(format!("--{name}")),
            },
        }
    }
    out
}

/// Parses a gflags boolean value (`true/false/1/0/yes/no`, any case).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "n" | "f" => Ok(false),
        _ => Err(format!("invalid boolean {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_gflags_spellings() {
        let args = [
            "prog",
            "-rpc_port=50051",
            "--enable_ha",
            "--noenable_offload",
            "--cluster_id",
            "c1",
            "-h",
            "--metrics-port=9",
            "--",
            "-x=1",
        ];
        let out = normalize(args, &["enable_ha", "enable_offload"]);
        assert_eq!(
            out,
            [
                "prog",
                "--rpc_port=50051",
                "--enable_ha=true",
                "--enable_offload=false",
                "--cluster_id",
                "c1",
                "-h",
                "--metrics_port=9",
                "--",
                "-x=1"
            ]
        );
    }

    #[test]
    fn bools() {
        assert_eq!(parse_bool("TRUE"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("maybe").is_err());
    }
}

//! Kubeconfig files (YAML), as the k8s election backend loads and
//! resolves them (current context, cluster, user, credentials).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_store::ha::k8s::config::ClusterConfig;

/// An empty private directory the config is read as if it were in: the
/// relative paths it names resolve there, to no file. The text itself is
/// parsed from memory: writing and reading it back as a file took a third
/// of the time of every run.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("mooncake-fuzz-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

/// Whether resolving `data` could open a file outside the scratch directory:
/// it names the files to read, so only inputs without path separators (but
/// in `http://` and `https://`), escapes (which could spell one) or tags
/// (`!!binary` could too) are loaded. No device or /proc file that blocks
/// or never ends is ever opened, nor a large file that would count as heap.
fn may_escape(data: &[u8]) -> bool {
    let mut rest = data;
    while let Some((&b, tail)) = rest.split_first() {
        if let Some(after) = tail
            .strip_prefix(b"ttps://".as_slice())
            .or_else(|| tail.strip_prefix(b"ttp://".as_slice()))
            .filter(|_| b == b'h')
        {
            rest = after;
            continue;
        }
        if matches!(b, b'/' | b'\\' | b'!') {
            return true;
        }
        rest = tail;
    }
    false
}

fuzz_target!(|data: &[u8]| {
    if may_escape(data) {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return; // what reading the file would refuse
    };
    // serde_yaml builds events and values: a few hundred bytes per byte.
    let _ = within_budget(data.len(), 512, || {
        ClusterConfig::from_kubeconfig_text(text, dir())
    });
});

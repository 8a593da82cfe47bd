//! The KV-event wire format, byte for byte as the reference's publisher
//! writes it: a batch is the msgpack array `[timestamp_ms, [event maps], 0]`
//! and each event a map whose keys come in a fixed order.

use rmp::encode;

/// What happened to a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stored,
    Removed,
}

/// The tier an event is about (`medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Cpu,
    Disk,
}

impl Medium {
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Cpu => "cpu",
            Medium::Disk => "disk",
        }
    }
}

/// One event waiting to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub kind: Kind,
    pub key: String,
    pub medium: Medium,
}

/// What every event of a publisher carries or leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub backend_id: String,
    /// The vLLM/SGLang names `type`, `block_hashes`, `parent_block_hash`.
    pub legacy: bool,
    /// `object_key`; also keeps events whose key is no hash.
    pub object_key: bool,
}

/// The block hash an object key names: decimal, or hex after `0x`/`0X`,
/// as C's `strtoull` reads them (leading blanks and a sign allowed in
/// decimal, a negative value wrapping), the whole key consumed.
pub fn seq_hash(key: &str) -> Option<u64> {
    let b = key.as_bytes();
    if b.len() >= 2 && b[0] == b'0' && (b[1] == b'x' || b[1] == b'X') {
        return digits(&b[2..], 16);
    }
    let mut i = 0;
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let negative = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let v = digits(&b[i..], 10)?;
    Some(if negative { v.wrapping_neg() } else { v })
}

/// At least one digit, all of them digits of `radix`, no overflow.
fn digits(b: &[u8], radix: u32) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u64, |acc, &c| {
        let d = (c as char).to_digit(radix)?;
        acc.checked_mul(radix as u64)?.checked_add(d as u64)
    })
}

/// An event ready to encode: its id and the hash its key names.
#[derive(Debug)]
pub struct Numbered<'a> {
    pub event: &'a Pending,
    pub id: u64,
    pub hash: Option<u64>,
}

/// Encodes one batch. `Vec<u8>` writes cannot fail.
pub fn batch(format: &Format, timestamp_ms: u64, events: &[Numbered<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 256);
    let w = &mut out;
    encode::write_array_len(w, 3).unwrap();
    encode::write_uint(w, timestamp_ms).unwrap();
    encode::write_array_len(w, events.len() as u32).unwrap();
    for e in events {
        event(w, format, timestamp_ms, e);
    }
    // The batch's dp_rank: the pool has no data-parallel rank.
    encode::write_uint(w, 0).unwrap();
    out
}

fn str(w: &mut Vec<u8>, s: &str) {
    encode::write_str(w, s).unwrap();
}

fn nil(w: &mut Vec<u8>) {
    encode::write_nil(w).unwrap();
}

fn map_len(stored: bool, f: &Format) -> u32 {
    let mut n = 13 + if f.legacy { 2 } else { 0 } + u32::from(f.object_key);
    n += match (stored, f.legacy) {
        (true, true) => 4,
        (true, false) => 3,
        (false, _) => 1,
    };
    n
}

fn event(w: &mut Vec<u8>, f: &Format, timestamp_ms: u64, e: &Numbered<'_>) {
    let stored = e.event.kind == Kind::Stored;
    encode::write_map_len(w, map_len(stored, f)).unwrap();
    str(w, "event_id");
    encode::write_uint(w, e.id).unwrap();
    str(w, "timestamp");
    encode::write_uint(w, timestamp_ms).unwrap();
    str(w, "event_type");
    str(w, if stored { "stored" } else { "removed" });
    if f.legacy {
        str(w, "type");
        str(
            w,
            if stored {
                "BlockStored"
            } else {
                "BlockRemoved"
            },
        );
    }
    // What only an indexer's registration knows is nil here.
    for k in ["model_name", "block_size", "additional_salt", "lora_name"] {
        str(w, k);
        nil(w);
    }
    // The master's key holds the object's tenant (`crate::tenant`).
    let (tenant, key) = crate::tenant::split(&e.event.key);
    str(w, "tenant_id");
    str(w, tenant);
    str(w, "backend_id");
    str(w, &f.backend_id);
    str(w, "group_id");
    nil(w);
    str(w, "medium");
    str(w, e.event.medium.as_str());
    str(w, "dp_rank");
    nil(w);
    if f.object_key {
        str(w, "object_key");
        str(w, key);
    }
    str(w, "seq_hashes");
    hashes(w, e.hash, |w, h| encode::write_uint(w, h).map(drop));
    if f.legacy {
        str(w, "block_hashes");
        // Signed, as vLLM's and SGLang's hashes are.
        hashes(w, e.hash, |w, h| encode::write_sint(w, h as i64).map(drop));
    }
    str(w, "base_block_idx");
    if stored {
        // A key is a standalone block: depth 0, no parent.
        encode::write_uint(w, 0).unwrap();
        for k in ["parent_hash", "token_ids"] {
            str(w, k);
            nil(w);
        }
        if f.legacy {
            str(w, "parent_block_hash");
            nil(w);
        }
    } else {
        nil(w);
    }
}

fn hashes(
    w: &mut Vec<u8>,
    hash: Option<u64>,
    put: impl Fn(&mut Vec<u8>, u64) -> Result<(), encode::ValueWriteError>,
) {
    match hash {
        Some(h) => {
            encode::write_array_len(w, 1).unwrap();
            put(w, h).unwrap();
        }
        None => {
            encode::write_array_len(w, 0).unwrap();
        }
    }
}

//! Encoders of the publishers' batches, byte for byte as each publisher
//! writes them (msgspec's encodings of vLLM's and SGLang's structs, the
//! master's maps): for tests, benchmarks and Rust publishers. The
//! decoders in `decode/` read them back.

use rmpv::Value;

use crate::event::{Event, Medium};

/// Which publisher's encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// vLLM with array-like structs: batch `[ts, events, dp]`, events
    /// `[tag, fields...]`.
    VllmArray,
    /// Newer vLLM: batch and events as maps, events tagged by `type`.
    VllmMap,
    /// SGLang: array-like, signed hashes, media `GPU`/`CPU_PINNED`/`DISK`,
    /// `cache_salt` in a trailing `metadata` map.
    Sglang,
    /// The Mooncake master's standard events (`docs/kv-events.md`).
    Mooncake,
}

fn s(x: &str) -> Value {
    Value::from(x)
}

fn opt_s(x: &Option<String>) -> Value {
    x.as_deref().map_or(Value::Nil, Value::from)
}

fn medium(style: Style, m: Medium) -> Value {
    s(match (style, m) {
        (Style::Mooncake, Medium::Gpu) => "gpu",
        (Style::Mooncake, Medium::Cpu) => "cpu",
        (Style::Mooncake, Medium::Disk) => "disk",
        (Style::Sglang, Medium::Cpu) => "CPU_PINNED",
        (_, m) => m.label(),
    })
}

fn hashes(style: Style, h: &[u64]) -> Value {
    Value::Array(
        h.iter()
            .map(|&x| {
                if style == Style::Sglang {
                    Value::from(x as i64)
                } else {
                    Value::from(x)
                }
            })
            .collect(),
    )
}

fn tagged(style: Style, tag: &str, fields: Vec<(&str, Value)>) -> Value {
    if style == Style::VllmMap {
        let mut m = vec![(s("type"), s(tag))];
        m.extend(fields.into_iter().map(|(k, v)| (s(k), v)));
        Value::Map(m)
    } else {
        let mut a = vec![s(tag)];
        a.extend(fields.into_iter().map(|(_, v)| v));
        Value::Array(a)
    }
}

fn engine_event(style: Style, ev: &Event) -> Value {
    match ev {
        Event::Stored(st) => {
            let lora_id = st
                .lora
                .as_deref()
                .and_then(|l| l.strip_prefix("lora_id:"))
                .and_then(|n| n.parse::<i64>().ok());
            let lora_name = st.lora.clone().filter(|l| !l.starts_with("lora_id:"));
            let mut f = vec![
                ("block_hashes", hashes(style, &st.hashes)),
                (
                    "parent_block_hash",
                    st.parent.map_or(Value::Nil, |p| {
                        if style == Style::Sglang {
                            Value::from(p as i64)
                        } else {
                            Value::from(p)
                        }
                    }),
                ),
                (
                    "token_ids",
                    Value::Array(st.tokens.iter().map(|&t| Value::from(t)).collect()),
                ),
                ("block_size", Value::from(st.block_size.unwrap_or(0))),
                ("lora_id", lora_id.map_or(Value::Nil, Value::from)),
                ("medium", medium(style, st.medium)),
            ];
            if style == Style::Sglang {
                if let Some(salt) = &st.salt {
                    f.push(("metadata", Value::Map(vec![(s("cache_salt"), s(salt))])));
                }
            } else {
                f.push(("lora_name", opt_s(&lora_name)));
            }
            tagged(style, "BlockStored", f)
        }
        Event::Removed(r) => tagged(
            style,
            "BlockRemoved",
            vec![
                ("block_hashes", hashes(style, &r.hashes)),
                ("medium", medium(style, r.medium)),
            ],
        ),
        Event::Cleared => tagged(style, "AllBlocksCleared", vec![]),
    }
}

/// One of the master's event maps, its keys in the master's order.
fn standard_event(id: u64, ts: u64, ev: &Event) -> Value {
    let (ty, legacy) = match ev {
        Event::Stored(_) => ("stored", "BlockStored"),
        Event::Removed(_) => ("removed", "BlockRemoved"),
        Event::Cleared => ("cleared", "AllBlocksCleared"),
    };
    let (tenant, med) = match ev {
        Event::Stored(st) => (st.tenant.clone(), Some(st.medium)),
        Event::Removed(r) => (r.tenant.clone(), Some(r.medium)),
        Event::Cleared => (None, None),
    };
    let mut m: Vec<(Value, Value)> = vec![
        (s("event_id"), Value::from(id)),
        (s("timestamp"), Value::from(ts)),
        (s("event_type"), s(ty)),
        (s("type"), s(legacy)),
        (s("model_name"), Value::Nil),
        (s("block_size"), Value::Nil),
        (s("additional_salt"), Value::Nil),
        (s("lora_name"), Value::Nil),
        (s("tenant_id"), s(tenant.as_deref().unwrap_or("default"))),
        (s("backend_id"), s("pool")),
        (s("group_id"), Value::Nil),
        (
            s("medium"),
            med.map_or(Value::Nil, |m| medium(Style::Mooncake, m)),
        ),
        (s("dp_rank"), Value::Nil),
    ];
    let hs = match ev {
        Event::Stored(st) => st.hashes.clone(),
        Event::Removed(r) => r.hashes.clone(),
        Event::Cleared => Vec::new(),
    };
    m.push((s("seq_hashes"), hashes(Style::Mooncake, &hs)));
    m.push((
        s("block_hashes"),
        Value::Array(hs.iter().map(|&h| Value::from(h as i64)).collect()),
    ));
    match ev {
        Event::Stored(st) => {
            m.push((s("base_block_idx"), Value::from(0)));
            m.push((s("parent_hash"), st.parent.map_or(Value::Nil, Value::from)));
            m.push((s("token_ids"), Value::Nil));
            m.push((s("parent_block_hash"), Value::Nil));
        }
        _ => m.push((s("base_block_idx"), Value::Nil)),
    }
    Value::Map(m)
}

/// One batch payload in `style`'s encoding.
pub fn batch(style: Style, ts: f64, events: &[Event], dp_rank: Option<i64>) -> Vec<u8> {
    let v = match style {
        Style::Mooncake => {
            let ms = (ts * 1000.0) as u64;
            let evs = events
                .iter()
                .enumerate()
                .map(|(i, e)| standard_event(i as u64 + 1, ms, e))
                .collect();
            Value::Array(vec![
                Value::from(ms),
                Value::Array(evs),
                Value::from(dp_rank.unwrap_or(0)),
            ])
        }
        Style::VllmMap => {
            let mut m = vec![
                (s("ts"), Value::from(ts)),
                (
                    s("events"),
                    Value::Array(events.iter().map(|e| engine_event(style, e)).collect()),
                ),
            ];
            if let Some(dp) = dp_rank {
                m.push((s("data_parallel_rank"), Value::from(dp)));
            }
            Value::Map(m)
        }
        Style::VllmArray | Style::Sglang => {
            let mut a = vec![
                Value::from(ts),
                Value::Array(events.iter().map(|e| engine_event(style, e)).collect()),
            ];
            if let Some(dp) = dp_rank {
                a.push(Value::from(dp));
            }
            Value::Array(a)
        }
    };
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).expect("writing to a Vec cannot fail");
    out
}

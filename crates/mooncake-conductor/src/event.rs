//! KV events as the index applies them, whatever publisher sent them: the
//! decoders (`decode/`) turn each wire format into these.

/// The cache tiers the index tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// G1, the device pool (GPU, NPU, HBM).
    Gpu,
    /// G2, host memory (pinned CPU memory, the Mooncake memory pool).
    Cpu,
    /// G3, disk-backed storage (SSD, shared filesystems).
    Disk,
}

impl Medium {
    pub const ALL: [Medium; 3] = [Medium::Gpu, Medium::Cpu, Medium::Disk];

    /// The medium a publisher names, case-insensitively: vLLM's `GPU`/`CPU`,
    /// SGLang's `GPU`/`CPU_PINNED`/`DISK`/`EXTERNAL` (an external pool such
    /// as Mooncake's counts as host memory), the master's `cpu`/`disk`.
    pub fn parse(s: &str) -> Option<Medium> {
        match s.to_ascii_uppercase().as_str() {
            "GPU" | "NPU" | "HBM" | "DEVICE" | "CUDA" => Some(Medium::Gpu),
            "CPU" | "CPU_PINNED" | "HOST" | "DRAM" | "EXTERNAL" => Some(Medium::Cpu),
            "DISK" | "SSD" => Some(Medium::Disk),
            _ => None,
        }
    }

    pub(crate) fn bit(self) -> u8 {
        match self {
            Medium::Gpu => 1,
            Medium::Cpu => 2,
            Medium::Disk => 4,
        }
    }

    /// The name answers use.
    pub fn label(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Disk => "DISK",
        }
    }
}

/// Blocks committed to a cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The publisher's hashes of the blocks, in prefix order (signed hashes
    /// as their two's-complement bits, byte hashes as their last 8 bytes).
    pub hashes: Vec<u64>,
    /// The publisher's hash of the block before the first one, if any.
    pub parent: Option<u64>,
    /// Every block's tokens, concatenated; empty when the publisher sends
    /// hashes only (then the hashes must be known or follow the standard).
    pub tokens: Vec<u32>,
    pub block_size: Option<u32>,
    pub medium: Medium,
    /// The LoRA namespace the event names (`lora_name`, or `lora_id:<id>`).
    pub lora: Option<String>,
    /// The salt the event names (SGLang's `cache_salt`, the standard's
    /// `additional_salt`).
    pub salt: Option<String>,
    /// The tenant the event names (the master's per-object tenant).
    pub tenant: Option<String>,
}

/// Blocks evicted from one medium.
#[derive(Clone, Debug, PartialEq)]
pub struct Removed {
    pub hashes: Vec<u64>,
    pub medium: Medium,
    /// The tenant the event names (the master's per-object tenant).
    pub tenant: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Stored(Stored),
    Removed(Removed),
    /// Everything this publisher held is gone.
    Cleared,
}

impl Event {
    /// The label metrics count the event under.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Stored(_) => "stored",
            Event::Removed(_) => "removed",
            Event::Cleared => "cleared",
        }
    }
}

/// One decoded batch: the events that decoded, and how many did not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub events: Vec<Event>,
    /// The batch's data-parallel rank, where the publisher sends one.
    pub dp_rank: Option<i64>,
    /// Events skipped because they did not decode.
    pub malformed: u32,
}

/// The LoRA namespace of a legacy integer adapter id (`None` for the base
/// model's `-1`).
pub fn lora_from_id(id: i64) -> Option<String> {
    (id >= 0).then(|| format!("lora_id:{id}"))
}

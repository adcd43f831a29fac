//! The interface every benchmarked index implements: the papers' 8-byte keys
//! and 8-byte values.

/// Structural counters an engine reports (zeros where it has no such thing).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct EngineStats {
    pub splits: u64,
    pub rebuilds: u64,
    pub rebuild_ms: f64,
}

/// A key-value index under benchmark. Every mutating call is durable when it
/// returns (except for the `volatile` upper bound, which never flushes).
pub trait BenchIndex: Send + Sync {
    /// Engine name as used on the command line (`--engine`).
    fn name(&self) -> &'static str;
    /// Inserts a key that is not present, or overwrites it.
    fn insert(&self, key: u64, value: u64);
    /// Replaces the value of a present key; false if absent.
    fn update(&self, key: u64, value: u64) -> bool;
    /// Removes a key; false if absent.
    fn delete(&self, key: u64) -> bool;
    fn search(&self, key: u64) -> Option<u64>;
    /// Up to `n` pairs with key >= `start`, in key order.
    fn scan(&self, start: u64, n: usize, out: &mut Vec<(u64, u64)>);
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    /// Whether several threads may operate at once with real parallelism
    /// (the baselines serialise every operation on one lock, so the
    /// benchmark runs them on one thread).
    fn concurrent(&self) -> bool {
        false
    }
    /// Leaf layout, for reports (`--leaf` of the tree, a short name otherwise).
    fn leaf(&self) -> &'static str {
        "-"
    }
}

/// How benchmark keys are presented to the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    /// 8-byte big-endian keys (the papers' setting).
    #[default]
    U64,
    /// YCSB-style string keys `user` + 20 decimal digits (24 bytes; only the
    /// tree engine stores variable-size keys).
    String,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::U64 => "u64",
            KeyKind::String => "string",
        }
    }
}

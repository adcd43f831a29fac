//! Crash-consistency campaigns (DESIGN §13): placeholder API, being written.

use crate::pmem::points;

/// Settings of one campaign.
#[derive(Clone, Debug)]
pub struct Config {
    pub ops: u64,
    pub seed: u64,
    pub threads: usize,
    /// Persistence point to drop (the checker's self-test).
    pub drop: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ops: 2000,
            seed: 7,
            threads: 1,
            drop: None,
        }
    }
}

/// What a campaign found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub leaf: String,
    pub ops: u64,
    pub seed: u64,
    pub threads: usize,
    pub drop: Option<String>,
    pub crash_states: u64,
    pub violations: u64,
    pub points_covered: Vec<String>,
    /// First violations, each saying seed, operation, crash point, image kind and what was wrong.
    pub violation_details: Vec<String>,
    pub seconds: f64,
}

/// Names of every persistence point (`nvstore crashtest --list-points`).
pub fn list_points() -> Vec<&'static str> {
    points::ALL.iter().map(|p| p.name).collect()
}

/// Runs a campaign.
pub fn run(cfg: &Config) -> Report {
    Report {
        leaf: "nv".into(),
        ops: cfg.ops,
        seed: cfg.seed,
        threads: cfg.threads,
        drop: cfg.drop.clone(),
        ..Report::default()
    }
}

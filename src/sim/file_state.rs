//! The decisions file's state in the simulation: the file an operator on a bastion writes,
//! that operator's own draws, and what the checks expect of it (see `decisions_file`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::log::SimLog;
use crate::core::planner::resume::LoggedDecision;
use crate::core::rng::Rng;

/// How far ahead of the machine's clock a bastion's clock runs, now and then.
pub const AHEAD: Duration = Duration::from_secs(600);

/// The file, its writer's own draws (a stream apart from the seed's, so a seed without a
/// file plays as it did before there was one), and what a restart must keep.
pub struct DecisionsFile {
    pub log: SimLog,
    pub(super) rng: Rng,
    /// A decision on a screen that overrides a file line dated ahead, to be made once the
    /// line was carried: (instance, kvstore id, the file's line was carried).
    pub(super) overrides: Vec<(usize, String, bool)>,
    /// What a restart must find in force: (instance, kvstore id, the screen's decision).
    pub(super) kept: Vec<(usize, String, LoggedDecision)>,
    /// The file's length as each instance last read it: it only grows, so a read is due
    /// only when it changed (as the binary's follower reads bytes that changed).
    pub(super) seen: BTreeMap<usize, usize>,
}

impl DecisionsFile {
    /// A seed's file, or none (half the seeds).
    pub fn of_seed(seed: u64) -> Option<Self> {
        let mut rng = Rng::new(seed ^ 0x5EED_F11E_D0C5);
        rng.chance(0.5).then(|| DecisionsFile {
            log: SimLog::default(),
            rng,
            overrides: Vec::new(),
            kept: Vec::new(),
            seen: BTreeMap::new(),
        })
    }

    /// Whatever was expected of `id` on instance `i` is moot: something later decided it.
    pub(super) fn later_on(&mut self, i: usize, id: &str) {
        self.kept.retain(|(j, k, _)| !(*j == i && k == id));
        self.overrides.retain(|(j, k, _)| !(*j == i && k == id));
    }
}

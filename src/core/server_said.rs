//! What the API server said over a span of a run beside its answers (how often it pushed
//! back, its warnings): for the progress line, the summary and the decision log's record.

use serde::{Deserialize, Serialize};

/// What the server said over a span of a run: for the progress line, the summary and the
/// decision log's record of the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSaid {
    /// Answers that were 429 (each waited out, never a failure).
    #[serde(default)]
    pub throttled: u64,
    /// Distinct `Warning` texts first heard in the span.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl ServerSaid {
    pub fn is_empty(&self) -> bool {
        self.throttled == 0 && self.warnings.is_empty()
    }
}

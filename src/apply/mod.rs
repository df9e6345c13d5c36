//! Carrying out operations against the API server: the executor, its rate limit, and the
//! outcome types every front end reads (outcomes, the apply report, progress, events).

pub mod executor;
pub mod outcome;
pub mod ratelimit;

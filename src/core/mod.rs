//! The pure core: no IO, no clock, no terminal. Every rule about identities lives here.

pub mod at_once;
pub mod audit;
pub mod decision_log;
pub mod executor;
pub mod fleet;
pub mod identity;
pub mod kvstore;
pub mod labels;
pub mod lease;
pub mod outcome;
pub mod plan_cache;
pub mod planner;
pub mod range;
pub mod request;
pub mod retry;
pub mod rng;
pub mod server_said;
pub mod switch;
pub mod sync;
pub mod verify;
pub mod words;

//! What an apply tells its watchers, defined beside the executor's rules in core
//! (`core::executor::outcome`) and named here for the front ends that read it.

pub use crate::core::executor::outcome::*;

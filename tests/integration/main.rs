//! The integration suite: one test binary against a real etcd and the sandbox API server.

mod audit;
mod cli;
mod decision_sequences;
mod decisions_kept;
mod docs;
mod e2e;
mod etcd;
mod fleet;
mod harness;
mod hostile_input;
mod image;
mod in_cluster;
mod layers;
mod outage;
mod proxy;
mod real;
mod record;
mod reliability;
mod reserve;
mod sandbox;
mod service;
#[path = "../support/mod.rs"]
mod support;
mod sync;
mod throttling;
mod tui;
mod writer;

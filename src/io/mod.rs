//! The only code that talks to the outside: etcd (read only), the Kubernetes API server,
//! the files the tool writes (plan, decision log, exports) and the dumps it rehearses on.

pub mod blocking;
pub mod decision_log;
pub mod endpoints;
pub mod etcd;
pub mod k8s;
pub mod kv_source;
pub mod lease;
pub mod list_stream;
pub mod mem_kv;
pub mod operator;
pub mod plan_file;
pub mod private_file;
pub mod refusal;
pub mod reservation;
pub mod retry;
pub mod runs;
pub mod snapshot_file;

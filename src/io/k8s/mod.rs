//! The Kubernetes side: connect like kubectl, list and follow CiliumIdentity objects, get,
//! create (never update) and delete them with preconditions, install the CRD, ask what the
//! credentials may do. kube's typed `Api` for single objects, access reviews, Leases and
//! small lists; raw streaming only for the big list and the watch, where reading as the
//! bytes arrive is what keeps a 100 MB list out of memory.

mod access;
mod annotated;
mod errors;
mod fleet_facts;
mod lists;
mod notes;
mod objects;
mod status_map;
mod switch_facts;
mod target;
mod transport;
mod watch;

pub use annotated::HEARTBEAT_ANNOTATION;
pub use errors::RequestError;
pub(crate) use errors::kube_call;
pub(crate) use lists::for_each_listed;
pub use lists::{K8sSnapshot, ReadMode};
pub use notes::{Mark, ServerNotes, ServerSaid, print_warnings_on_stderr, warning_texts};
pub use objects::{CrdState, ObjectRef};
pub use status_map::STATUS_LABEL;
pub use target::{K8sOptions, K8sTarget, urlencode};
pub use watch::{K8sChange, WATCH_IDLE, WATCH_ROTATE};

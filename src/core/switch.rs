//! The switch to operator-managed identities (Cilium 1.18's `identity-management-mode`):
//! the label filter and label sets the operator computes, and the report of what the switch
//! does to every pod and identity, before it is made.

pub mod computed;
pub mod endpoints;
pub mod filter;
pub mod prepare;
pub mod report;
pub mod settings;

//! One writer per cluster, as rules: client-go's leader election over a
//! `coordination.k8s.io/v1` Lease, with no IO and no clock (`now` comes in). Another
//! holder's lease counts as expired only once its record has not changed for a whole lease
//! duration on our own clock (no trust in clock skew); every change is a replace at the
//! version read, so two candidates cannot both win; and a holder that cannot renew within
//! two thirds of the duration stops writing before anyone else may start. `keeper` makes
//! the requests over a `LeaseStore` (the API server in `app::lease`); the simulation drives the same rules with several instances.

use std::time::{Duration, Instant};

/// Who may write now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    /// Not known yet (the first answer has not come), or the renewal deadline passed.
    Unknown,
    /// This sync holds the lease: it writes.
    Us,
    /// Another sync holds it: this one follows and waits.
    Other { holder: String },
    /// The API server refuses the lease to these credentials (403): the operator's to fix.
    Refused(String),
}

/// The Lease object as read: who holds it, for how long, at which version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; `None` when empty (released).
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds` (15 when unset, at least 1).
    pub duration: Duration,
    /// `metadata.resourceVersion`: a replace is made at it.
    pub version: String,
}

/// What to do with the record read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// There is none: create it, held by us.
    Create,
    /// Ours, free, or expired: replace it at the version read, held by us. `take` when it
    /// was not ours (a transition: a new acquire time, one more transition counted).
    Replace { take: bool },
    /// Another holder's, still valid on our clock: wait.
    HeldBy(String),
}

/// How one try ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TryOutcome {
    /// Created or replaced: ours, at this version.
    Held { version: String },
    /// Another holder's, or another candidate wrote first (409, or AlreadyExists).
    HeldBy(String),
    /// 403: these credentials may not hold the lease.
    Refused(String),
    /// Unreachable, failing or hanging: the write gate closes on its own at the deadline.
    Failed,
}

/// Between tries after a failure or while another holds the lease.
pub const RETRY: Duration = Duration::from_secs(2);

/// The lease as one candidate (`me`) sees it: the rules of taking, renewing and the write
/// gate.
#[derive(Debug, Clone)]
pub struct Elector {
    me: String,
    duration: Duration,
    writer: Writer,
    /// Until when writes are allowed: the start of the last successful try plus two thirds
    /// of the duration.
    gate_until: Option<Instant>,
    /// The last version of the record seen, and since when (our clock).
    seen_version: String,
    seen_since: Option<Instant>,
}

impl Elector {
    pub fn new(me: impl Into<String>, duration: Duration) -> Self {
        Elector {
            me: me.into(),
            duration,
            writer: Writer::Unknown,
            gate_until: None,
            seen_version: String::new(),
            seen_since: None,
        }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// How long a holder keeps the Lease without renewing.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// How often the holder renews (a third of the duration): a try that takes longer is
    /// given up, in time to try again before the deadline.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    /// Until when this candidate may write (its gate), if it may at all: only while it holds
    /// the lease. What the binary's keeper publishes and the simulation's gates are, and the
    /// deadline at which the holder must notice it may no longer write (to say so).
    pub fn gate_until(&self) -> Option<Instant> {
        // Set only by a try that held the lease, cleared whenever it is not held.
        self.gate_until
    }

    /// Whether this candidate may write at `now`: it holds the lease and its last renewal
    /// started less than two thirds of the duration ago.
    pub fn may_write(&self, now: Instant) -> bool {
        self.writer == Writer::Us && self.gate_until.is_some_and(|until| now < until)
    }

    /// What to do with `record` (`None`: there is none), read at `now`.
    pub fn claim(&mut self, record: Option<&LeaseRecord>, now: Instant) -> Claim {
        let Some(record) = record else {
            return Claim::Create;
        };
        if self.seen_version != record.version || self.seen_since.is_none() {
            self.seen_version = record.version.clone();
            self.seen_since = Some(now);
        }
        match &record.holder {
            Some(h) if *h != self.me => {
                // Expired only once unchanged for a whole duration on our clock.
                let unchanged_for = self
                    .seen_since
                    .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
                if unchanged_for < record.duration {
                    Claim::HeldBy(h.clone())
                } else {
                    Claim::Replace { take: true }
                }
            }
            Some(_) => Claim::Replace { take: false },
            None => Claim::Replace { take: true },
        }
    }

    /// The try that started at `started` ended at `now` with `outcome`; returns how long
    /// to wait before the next try.
    pub fn tried(&mut self, outcome: TryOutcome, started: Instant, now: Instant) -> Duration {
        let renew_every = self.renew_every();
        match outcome {
            TryOutcome::Held { version } => {
                self.seen_version = version;
                self.seen_since = Some(now);
                // The validity counts from before the request: its answer may come late.
                self.gate_until = Some(started + self.duration * 2 / 3);
                self.writer = Writer::Us;
                renew_every.saturating_sub(now.saturating_duration_since(started))
            }
            TryOutcome::HeldBy(holder) => {
                self.gate_until = None;
                self.writer = Writer::Other { holder };
                RETRY
            }
            TryOutcome::Refused(why) => {
                self.gate_until = None;
                self.writer = Writer::Refused(why);
                RETRY
            }
            TryOutcome::Failed => RETRY.min(renew_every),
        }
    }

    /// At `now`: past the deadline, the holder may no longer write and knows nothing of
    /// who holds the lease. Returns whether that just happened.
    pub fn check_deadline(&mut self, now: Instant) -> bool {
        if self.gate_until.is_some_and(|d| now >= d) {
            self.gate_until = None;
            self.writer = Writer::Unknown;
            return true;
        }
        false
    }

    /// A clean stop: no more writes; whether the record should be cleared (it was ours).
    pub fn release(&mut self) -> bool {
        let held = self.gate_until.is_some();
        self.gate_until = None;
        self.writer = Writer::Unknown;
        held
    }
}

/// Why a write may not start now, if it may not: a stop asked for (the operator's), or the
/// one-writer Lease's gate shut (`gate_open`: `None` where no gate applies, as in apply).
/// Checked before every create, by the executor (`StopFlag`) and by the simulation's
/// batches alike, so a batch cut short says the same in both.
pub fn write_held_back(stop_asked: bool, gate_open: Option<bool>) -> Option<&'static str> {
    if stop_asked {
        Some("stopped by the operator")
    } else if gate_open == Some(false) {
        Some("the one-writer Lease's gate shut: this sync may not write now")
    } else {
        None
    }
}

pub mod keeper;

#[cfg(test)]
mod tests;

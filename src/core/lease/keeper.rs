//! The Lease keeper's try and its release, written once over a `LeaseStore`: read the
//! Lease, let the `Elector` decide, create or replace it at the version read, and say what
//! each answer of the API server means (a 409 is another writer's, a 403 the operator's to
//! fix, anything else an outage to retry). The binary runs them against the API server
//! (`app::lease`); the simulation runs the same code against its own, with several
//! instances' tries interleaved between their reads and their writes.

use std::time::{Duration, Instant};

use super::{Claim, Elector, LeaseRecord, TryOutcome};

/// What the API server answered to a request on the Lease, when it was not a success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseError {
    /// The HTTP status of a Status answer; `None` when none came (unreachable, timed out).
    pub code: Option<u16>,
    /// The Status's reason (`AlreadyExists`, `Conflict`, ...), or empty.
    pub reason: String,
    /// The whole error, to tell the operator.
    pub text: String,
}

impl LeaseError {
    /// No answer at all (unreachable, a hung connection).
    pub fn unanswered(text: impl Into<String>) -> Self {
        LeaseError {
            code: None,
            reason: String::new(),
            text: text.into(),
        }
    }
}

/// A replace of the Lease read last, at its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Held by `holder` for `duration`, renewed now; `transition` when it was not `holder`'s
    /// (a new acquire time, one more transition counted).
    Hold {
        holder: String,
        duration: Duration,
        transition: bool,
    },
    /// Given up: no holder, a duration of one second, so another takes over at once.
    Clear,
}

/// The Lease as the API server keeps it.
#[allow(async_fn_in_trait)]
pub trait LeaseStore {
    /// Reads the Lease (`None`: there is none); a replace is made at the version read.
    async fn read(&mut self) -> Result<Option<LeaseRecord>, LeaseError>;
    /// Creates it, held by `holder` for `duration`; its new version.
    async fn create(&mut self, holder: &str, duration: Duration) -> Result<String, LeaseError>;
    /// Replaces the Lease read last, at its version; its new version.
    async fn replace(&mut self, write: LeaseWrite) -> Result<String, LeaseError>;
}

/// Refused to these credentials: waiting will not fix it.
fn refused(e: &LeaseError) -> bool {
    e.code == Some(403)
}

/// What an error means for a try: refused, or failed (tried again).
fn outcome_of(e: LeaseError) -> TryOutcome {
    if refused(&e) {
        TryOutcome::Refused(e.text)
    } else {
        TryOutcome::Failed
    }
}

impl Elector {
    /// One try: read the Lease, decide, and create or replace it at the version read when
    /// the rules claim it. `now` is this candidate's clock: "unchanged for a whole
    /// duration" counts from when the record was seen, at the answer.
    pub async fn try_take(
        &mut self,
        store: &mut impl LeaseStore,
        now: &impl Fn() -> Instant,
    ) -> TryOutcome {
        let record = match store.read().await {
            Ok(r) => r,
            Err(e) => return outcome_of(e),
        };
        let take = match self.claim(record.as_ref(), now()) {
            Claim::HeldBy(holder) => return TryOutcome::HeldBy(holder),
            Claim::Create => {
                return match store.create(self.me(), self.duration()).await {
                    Ok(version) => TryOutcome::Held { version },
                    // Another candidate created it first: theirs.
                    Err(e) if e.code == Some(409) => TryOutcome::HeldBy("another sync".into()),
                    Err(e) => outcome_of(e),
                };
            }
            Claim::Replace { take } => take,
        };
        let write = LeaseWrite::Hold {
            holder: self.me().to_string(),
            duration: self.duration(),
            transition: take,
        };
        match store.replace(write).await {
            Ok(version) => TryOutcome::Held { version },
            // Someone wrote it in between (a renewal, another candidate): not ours this time.
            Err(e) if e.code == Some(409) => TryOutcome::HeldBy(
                record
                    .and_then(|r| r.holder)
                    .unwrap_or_else(|| "another sync".into()),
            ),
            Err(e) => outcome_of(e),
        }
    }

    /// A clean stop: no more writes, and the holder cleared (as client-go's release on
    /// cancel does) if the Lease was ours and still names us, so a waiting sync takes over
    /// at once. Whether it was cleared.
    pub async fn give_up(&mut self, store: &mut impl LeaseStore) -> bool {
        if !self.release() {
            return false;
        }
        let Ok(Some(record)) = store.read().await else {
            return false;
        };
        if record.holder.as_deref() != Some(self.me()) {
            return false;
        }
        store.replace(LeaseWrite::Clear).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::at_once::at_once;
    use crate::core::lease::Writer;

    /// A store whose answers are given in advance, recording the writes asked for.
    #[derive(Default)]
    struct Scripted {
        read: Option<Result<Option<LeaseRecord>, LeaseError>>,
        write: Option<Result<String, LeaseError>>,
        writes: Vec<String>,
    }

    impl LeaseStore for Scripted {
        async fn read(&mut self) -> Result<Option<LeaseRecord>, LeaseError> {
            self.read.take().unwrap_or(Ok(None))
        }
        async fn create(&mut self, holder: &str, _: Duration) -> Result<String, LeaseError> {
            self.writes.push(format!("create {holder}"));
            self.write.take().unwrap_or(Ok("1".into()))
        }
        async fn replace(&mut self, write: LeaseWrite) -> Result<String, LeaseError> {
            self.writes.push(format!("{write:?}"));
            self.write.take().unwrap_or(Ok("2".into()))
        }
    }

    fn status(code: u16, reason: &str) -> LeaseError {
        LeaseError {
            code: Some(code),
            reason: reason.into(),
            text: format!("{code} {reason}"),
        }
    }

    fn record(holder: Option<&str>, version: &str) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(String::from),
            duration: Duration::from_secs(15),
            version: version.into(),
        }
    }

    fn try_with(store: &mut Scripted) -> (Elector, TryOutcome) {
        let mut e = Elector::new("me", Duration::from_secs(15));
        let t = Instant::now();
        let outcome = at_once(e.try_take(store, &|| t)).unwrap();
        (e, outcome)
    }

    #[test]
    fn no_lease_is_created_and_another_creating_it_first_makes_it_theirs() {
        let mut store = Scripted::default();
        assert_eq!(
            try_with(&mut store).1,
            TryOutcome::Held {
                version: "1".into()
            }
        );
        assert_eq!(store.writes, ["create me"]);
        let mut store = Scripted {
            write: Some(Err(status(409, "AlreadyExists"))),
            ..Default::default()
        };
        assert_eq!(
            try_with(&mut store).1,
            TryOutcome::HeldBy("another sync".into())
        );
    }

    #[test]
    fn a_free_lease_is_taken_at_the_version_read_and_a_409_means_another_won() {
        let mut store = Scripted {
            read: Some(Ok(Some(record(None, "7")))),
            ..Default::default()
        };
        assert_eq!(
            try_with(&mut store).1,
            TryOutcome::Held {
                version: "2".into()
            }
        );
        assert_eq!(
            store.writes,
            [format!(
                "{:?}",
                LeaseWrite::Hold {
                    holder: "me".into(),
                    duration: Duration::from_secs(15),
                    transition: true
                }
            )]
        );
        let mut store = Scripted {
            read: Some(Ok(Some(record(Some("me"), "7")))),
            write: Some(Err(status(409, "Conflict"))),
            ..Default::default()
        };
        assert_eq!(try_with(&mut store).1, TryOutcome::HeldBy("me".into()));
    }

    #[test]
    fn a_403_is_refused_on_every_request_and_anything_else_is_tried_again() {
        for (read, write) in [
            (Some(Err(status(403, "Forbidden"))), None),
            (None, Some(Err(status(403, "Forbidden")))),
        ] {
            let mut store = Scripted {
                read,
                write,
                ..Default::default()
            };
            assert_eq!(
                try_with(&mut store).1,
                TryOutcome::Refused("403 Forbidden".into())
            );
        }
        for e in [
            status(500, "InternalError"),
            status(401, "Unauthorized"),
            LeaseError::unanswered("connection refused"),
        ] {
            let mut store = Scripted {
                read: Some(Err(e)),
                ..Default::default()
            };
            assert_eq!(try_with(&mut store).1, TryOutcome::Failed);
        }
        // A replace refused, or failing otherwise, is no other holder's win.
        for (e, outcome) in [
            (
                status(403, "Forbidden"),
                TryOutcome::Refused("403 Forbidden".into()),
            ),
            (status(500, "InternalError"), TryOutcome::Failed),
        ] {
            let mut store = Scripted {
                read: Some(Ok(Some(record(None, "7")))),
                write: Some(Err(e)),
                ..Default::default()
            };
            assert_eq!(try_with(&mut store).1, outcome);
        }
    }

    #[test]
    fn another_holders_valid_lease_is_left_alone() {
        let mut store = Scripted {
            read: Some(Ok(Some(record(Some("other"), "7")))),
            ..Default::default()
        };
        assert_eq!(try_with(&mut store).1, TryOutcome::HeldBy("other".into()));
        assert!(store.writes.is_empty());
    }

    #[test]
    fn giving_up_clears_only_a_lease_held_that_still_names_us() {
        let t = Instant::now();
        let mut e = Elector::new("me", Duration::from_secs(15));
        let mut store = Scripted::default();
        // Never held: nothing read, nothing written.
        assert!(!at_once(e.give_up(&mut store)).unwrap());
        e.tried(
            TryOutcome::Held {
                version: "1".into(),
            },
            t,
            t,
        );
        assert_eq!(*e.writer(), Writer::Us);
        let mut taken = e.clone();
        let mut store = Scripted {
            read: Some(Ok(Some(record(Some("other"), "3")))),
            ..Default::default()
        };
        assert!(!at_once(taken.give_up(&mut store)).unwrap());
        assert!(store.writes.is_empty());
        let mut store = Scripted {
            read: Some(Ok(Some(record(Some("me"), "1")))),
            ..Default::default()
        };
        assert!(at_once(e.give_up(&mut store)).unwrap());
        assert_eq!(store.writes, [format!("{:?}", LeaseWrite::Clear)]);
        assert_eq!(*e.writer(), Writer::Unknown);
    }
}

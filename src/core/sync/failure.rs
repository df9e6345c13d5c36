//! What ends sync and what it rides out, as rules: a refusal (401, 403, etcd's permission
//! denied) of something sync needs is configuration, which waiting never fixes, so sync
//! ends (exit 2) naming what to grant; an outage (refused connections, 5xx, timeouts) is
//! tried again after a wait (`core::retry`'s `FOLLOW` policy). The binary's dispatcher
//! classifies each error it meets into a `Fault` and asks here; the simulation asks the
//! same for the failures its world makes.

use std::time::Duration;

/// Where a failure was met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The kvstore's connection and snapshot at a round's start.
    KvRead,
    /// The list of CiliumIdentities at a round's start, or after the watch expired (410).
    K8sList,
    /// The watch of CiliumIdentities.
    K8sWatch,
    /// The kvstore's watch.
    KvWatch,
    /// A create of a CiliumIdentity.
    Create,
    /// The reservation writer's start: a probe write under the prefix, and a lease.
    ReservationStart,
    /// The one-writer Lease's read, create or renewal (the keeper's try).
    Lease,
}

/// A failure as the rules need it; the dispatcher reads it off the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fault {
    /// The server refused (a 4xx other than 408 and 429; etcd's permission denied,
    /// unauthenticated, invalid argument or failed precondition).
    pub refused: bool,
    /// The HTTP status, when a Status came.
    pub code: Option<u16>,
    /// Sent with the token the token file held before it was renewed: a 401 then says
    /// nothing about the credentials now.
    pub old_token: bool,
    /// Configuration this process reads (no endpoints, an unreadable certificate): never
    /// fixed by waiting.
    pub config: bool,
}

impl Fault {
    /// No answer at all: a server down or out of reach.
    pub fn outage() -> Self {
        Fault::default()
    }

    /// A 403 Forbidden: the credentials may not do this.
    pub fn forbidden() -> Self {
        Fault {
            refused: true,
            code: Some(403),
            ..Fault::default()
        }
    }
}

/// What sync does after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Ends sync (exit 2), naming what was refused.
    End,
    /// Tries again after the backoff's wait.
    Retry,
}

/// The rule for a failure met on `path`.
pub fn then(path: Path, fault: Fault) -> Then {
    if fault.config {
        return Then::End;
    }
    let ends = match path {
        Path::KvRead | Path::K8sList | Path::Create | Path::ReservationStart | Path::Lease => {
            fault.refused
        }
        // A watch's 401 or 403 ends sync, unless it was sent with a token since renewed.
        // Other refusals of a watch (a 410, a 400 for a version too old) are its own end,
        // watched again from a fresh point.
        Path::K8sWatch => matches!(fault.code, Some(401 | 403)) && !fault.old_token,
        // The kvstore's watch runs on the credentials the round's snapshot just used; what
        // it meets (a compaction, a leader change, a stalled member) is watched again from
        // the last revision.
        Path::KvWatch => false,
    };
    if ends { Then::End } else { Then::Retry }
}

/// A watch open for less than this that closes cleanly with nothing said (a proxy closing
/// streams) is not opened again at once: the backoff's wait comes first.
pub const QUICK_CLOSE: Duration = Duration::from_secs(5);

/// Whether a watch that ended cleanly waits before it is opened again: it closed within
/// `QUICK_CLOSE` having delivered nothing.
pub fn closed_at_once(heard: bool, open_for: Duration) -> bool {
    !heard && open_for < QUICK_CLOSE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> Fault {
        Fault {
            refused: (400..500).contains(&code) && code != 408 && code != 429,
            code: Some(code),
            ..Fault::default()
        }
    }

    #[test]
    fn a_refusal_of_a_read_a_create_or_the_writers_start_ends_sync_and_an_outage_is_ridden_out() {
        for path in [
            Path::KvRead,
            Path::K8sList,
            Path::Create,
            Path::ReservationStart,
        ] {
            for code in [401, 403, 404] {
                assert_eq!(then(path, status(code)), Then::End, "{path:?} {code}");
            }
            for code in [408, 429, 500, 503] {
                assert_eq!(then(path, status(code)), Then::Retry, "{path:?} {code}");
            }
            assert_eq!(then(path, Fault::outage()), Then::Retry, "{path:?}");
        }
    }

    #[test]
    fn a_watch_ends_sync_only_on_401_or_403_with_the_token_in_use_and_the_kvstores_never() {
        assert_eq!(then(Path::K8sWatch, status(403)), Then::End);
        assert_eq!(then(Path::K8sWatch, status(401)), Then::End);
        let renewed = Fault {
            old_token: true,
            ..status(401)
        };
        assert_eq!(then(Path::K8sWatch, renewed), Then::Retry);
        for code in [400, 410, 500] {
            assert_eq!(then(Path::K8sWatch, status(code)), Then::Retry, "{code}");
        }
        assert_eq!(then(Path::KvWatch, status(403)), Then::Retry);
    }

    #[test]
    fn configuration_ends_sync_wherever_it_is_met() {
        let config = Fault {
            config: true,
            ..Fault::default()
        };
        for path in [Path::KvRead, Path::KvWatch, Path::K8sWatch] {
            assert_eq!(then(path, config), Then::End, "{path:?}");
        }
    }

    #[test]
    fn only_a_watch_that_closes_at_once_with_nothing_said_waits_first() {
        assert!(closed_at_once(false, Duration::from_secs(1)));
        assert!(!closed_at_once(true, Duration::from_secs(1)));
        assert!(!closed_at_once(false, QUICK_CLOSE));
    }
}

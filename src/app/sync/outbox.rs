//! What sync says, on its way to a front end that may be slow (a terminal paused with
//! Ctrl-S, a pager, a TUI busy drawing): queued here and handed over as fast as the front
//! end takes it, so sync's loop never waits on it. A status line or a node count replaces
//! the one still queued (only the latest matters); past `KEEP` events the oldest go, counted,
//! and a note says how many were not shown.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::mpsc::{self, error::TrySendError};

use super::event::SyncEvent;

/// Events held for a front end that takes none: far more than a healthy one ever lags by.
pub const KEEP: usize = 4096;

pub struct Outbox {
    tx: mpsc::Sender<SyncEvent>,
    queue: VecDeque<SyncEvent>,
    /// Events dropped since the last note saying so.
    dropped: u64,
}

impl Outbox {
    pub fn new(tx: mpsc::Sender<SyncEvent>) -> Self {
        Outbox {
            tx,
            queue: VecDeque::new(),
            dropped: 0,
        }
    }

    /// Queues `ev` and hands over what the front end takes now; never waits.
    pub fn say(&mut self, ev: SyncEvent) {
        let superseded = |queued: &SyncEvent| {
            matches!(
                (queued, &ev),
                (SyncEvent::Status(_), SyncEvent::Status(_))
                    | (SyncEvent::NodeCounts(_), SyncEvent::NodeCounts(_))
            )
        };
        self.queue.retain(|q| !superseded(q));
        self.queue.push_back(ev);
        while self.queue.len() > KEEP {
            self.queue.pop_front();
            self.dropped += 1;
        }
        self.flush();
    }

    /// Hands over as much of the queue as the front end takes now.
    pub fn flush(&mut self) {
        if self.dropped > 0 {
            let note = SyncEvent::Note(format!(
                "{} of sync's events were not shown: the front end took none for a while (sync went on)",
                self.dropped
            ));
            match self.tx.try_send(note) {
                Ok(()) => self.dropped = 0,
                Err(TrySendError::Full(_)) => return,
                Err(TrySendError::Closed(_)) => return self.queue.clear(),
            }
        }
        while let Some(ev) = self.queue.pop_front() {
            match self.tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(ev)) => {
                    self.queue.push_front(ev);
                    return;
                }
                // No front end any more: nothing to keep.
                Err(TrySendError::Closed(_)) => return self.queue.clear(),
            }
        }
    }

    /// At the end: what is still queued, waiting for the front end at most `within`.
    pub async fn drain(&mut self, within: Duration) {
        let sending = async {
            while let Some(ev) = self.queue.pop_front() {
                if self.tx.send(ev).await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(within, sending).await;
    }

    /// Events waiting for the front end.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::sync::SyncStatus;

    #[tokio::test]
    async fn a_front_end_that_takes_nothing_never_blocks_and_loses_only_what_is_superseded() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut out = Outbox::new(tx);
        out.say(SyncEvent::Note("first".into()));
        for n in 0..100u64 {
            out.say(SyncEvent::Status(SyncStatus {
                mirrored: n,
                ..Default::default()
            }));
        }
        out.say(SyncEvent::Trouble("second".into()));
        // One in the channel, the latest status and the trouble queued: 99 statuses were
        // superseded, nothing else.
        assert_eq!(out.queued(), 2);
        assert!(matches!(rx.recv().await, Some(SyncEvent::Note(n)) if n == "first"));
        out.flush();
        assert!(
            matches!(rx.recv().await, Some(SyncEvent::Status(s)) if s.mirrored == 99),
            "the latest status"
        );
        out.drain(Duration::from_secs(1)).await;
        assert!(matches!(rx.recv().await, Some(SyncEvent::Trouble(t)) if t == "second"));
    }

    #[tokio::test]
    async fn past_what_it_keeps_the_oldest_go_and_a_note_says_how_many() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut out = Outbox::new(tx);
        for n in 0..KEEP + 11 {
            out.say(SyncEvent::Note(n.to_string()));
        }
        assert_eq!(out.queued(), KEEP);
        assert!(matches!(rx.recv().await, Some(SyncEvent::Note(n)) if n == "0"));
        out.flush();
        match rx.recv().await {
            Some(SyncEvent::Note(n)) => {
                assert!(n.starts_with("10 of sync's events were not shown"), "{n}")
            }
            other => panic!("{other:?}"),
        }
        out.flush();
        // The first kept is the one after those dropped: 1 went out, 10 were dropped.
        assert!(matches!(rx.recv().await, Some(SyncEvent::Note(n)) if n == "11"));
    }
}

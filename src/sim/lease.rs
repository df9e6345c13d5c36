//! The API server's Lease as the simulated keepers meet it: each keeper's try is core's
//! (`Elector::try_take`, the very code the binary runs), over a store of the simulated
//! API server. Every try due reads first, then the writes land in an order the seed picks,
//! so one keeper's write can come between another's read and write (a 409).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::report::Failure;
use super::world::World;
use crate::core::lease::keeper::{LeaseError, LeaseStore, LeaseWrite};
use crate::core::lease::{Elector, LeaseRecord, TryOutcome};

/// One keeper's view of the simulated API server.
struct SimStore<'w, 'a> {
    world: &'w RefCell<&'a mut World>,
    /// Its requests fail (the API server unreachable from it).
    fails: bool,
    /// Its requests are refused (403: the Lease Role's rule taken away).
    refused: bool,
    /// The version read last: a replace is made at it.
    read: Option<String>,
}

/// Waits once: the point between a keeper's read and its write where another's may land.
struct Turn(bool);

impl Future for Turn {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl SimStore<'_, '_> {
    fn unreachable(&self) -> Result<(), LeaseError> {
        if self.fails {
            return Err(LeaseError::unanswered("the API server is unreachable"));
        }
        if self.refused {
            return Err(LeaseError {
                code: Some(403),
                reason: "Forbidden".into(),
                text: "leases.coordination.k8s.io \"cilium-idmig-sync\" is forbidden".into(),
            });
        }
        Ok(())
    }
}

impl LeaseStore for SimStore<'_, '_> {
    async fn read(&mut self) -> Result<Option<LeaseRecord>, LeaseError> {
        self.unreachable()?;
        let record = self.world.borrow().lease.clone();
        self.read = record.as_ref().map(|r| r.version.clone());
        Ok(record)
    }

    async fn create(&mut self, holder: &str, duration: Duration) -> Result<String, LeaseError> {
        Turn(false).await;
        self.unreachable()?;
        self.world
            .borrow_mut()
            .lease_write(None, Some(holder), duration)
    }

    async fn replace(&mut self, write: LeaseWrite) -> Result<String, LeaseError> {
        Turn(false).await;
        self.unreachable()?;
        let read = self.read.take();
        let (holder, duration) = match &write {
            LeaseWrite::Hold {
                holder, duration, ..
            } => (Some(holder.as_str()), *duration),
            LeaseWrite::Clear => (None, Duration::from_secs(1)),
        };
        let read = read.ok_or_else(|| LeaseError::unanswered("replaced before read"))?;
        self.world
            .borrow_mut()
            .lease_write(Some(&read), holder, duration)
    }
}

type Try<'f> = Pin<Box<dyn Future<Output = TryOutcome> + 'f>>;

fn poll(f: &mut Try<'_>) -> Poll<TryOutcome> {
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// The tries of the keepers given (index, elector, whether its requests fail), at `at`:
/// each reads, then the writes land in order, or reversed when `reversed`; every request
/// refused when `refused`. Each try's outcome, by index.
pub fn tries(
    world: &mut World,
    keepers: Vec<(usize, &mut Elector, bool)>,
    at: Instant,
    reversed: bool,
    refused: bool,
) -> Result<Vec<(usize, TryOutcome)>, Failure> {
    let world = RefCell::new(world);
    let due: Vec<(usize, Try<'_>)> = keepers
        .into_iter()
        .map(|(i, elector, fails)| {
            let mut store = SimStore {
                world: &world,
                fails,
                refused,
                read: None,
            };
            let f: Try<'_> = Box::pin(async move { elector.try_take(&mut store, &|| at).await });
            (i, f)
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut writing = Vec::new();
    // The reads (and the tries that end without writing).
    for (i, mut f) in due {
        match poll(&mut f) {
            Poll::Ready(o) => outcomes.push((i, o)),
            Poll::Pending => writing.push((i, f)),
        }
    }
    if reversed {
        writing.reverse();
    }
    for (i, mut f) in writing {
        match poll(&mut f) {
            Poll::Ready(o) => outcomes.push((i, o)),
            Poll::Pending => {
                return Err(Failure::new(
                    "the simulation's IO answers at once",
                    format!("i{i}'s Lease try waited twice"),
                ));
            }
        }
    }
    Ok(outcomes)
}

/// A clean stop's give-up, core's (`Elector::give_up`): whether the Lease was cleared
/// (`refused`: every request refused).
pub fn give_up(
    world: &mut World,
    elector: &mut Elector,
    fails: bool,
    refused: bool,
) -> Result<bool, Failure> {
    let world = RefCell::new(world);
    let mut store = SimStore {
        world: &world,
        fails,
        refused,
        read: None,
    };
    let mut f = std::pin::pin!(elector.give_up(&mut store));
    // The read, then the write after its turn.
    for _ in 0..2 {
        if let Poll::Ready(cleared) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return Ok(cleared);
        }
    }
    Err(Failure::new(
        "the simulation's IO answers at once",
        "a Lease give-up waited twice".to_string(),
    ))
}

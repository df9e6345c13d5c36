//! Running a future to its end in one poll: the simulation drives the very async code the
//! binary runs (the reservation writer, the Lease keeper's tries) over IO that answers every
//! call at once, so no executor and no clock are needed to run it deterministically.

use std::future::Future;
use std::task::{Context, Poll, Waker};

/// Runs `f` to its end, which it reaches in one poll when nothing beneath it waits; `None`
/// if it would wait (IO that does not answer at once: a bug in the simulation's world).
pub fn at_once<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_that_never_waits_ends_in_one_poll_and_one_that_waits_does_not() {
        assert_eq!(at_once(async { 7 }), Some(7));
        assert_eq!(at_once(std::future::pending::<u8>()), None);
    }
}

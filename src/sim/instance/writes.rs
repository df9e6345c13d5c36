//! The simulated API server beneath core's executor (`core::executor::carry_out`), the code
//! the binary runs: each create, read and delete answered at once by the world, with the
//! faults of the moment (a 403 from RBAC, an admission webhook's denial of one object, 500s),
//! every create checked to be the sole writer's, and each outcome logged as the binary logs it.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::decision_log::Record;
use crate::core::executor::{ApplyOptions, Existing, IdentityWrites, Written};
use crate::core::labels::{SecurityLabels, canonical_key, parse_label_key, to_security_labels};
use crate::core::lease::write_held_back;
use crate::core::request::RequestError;
use crate::core::rng::Rng;
use crate::sim::log::SimLog;
use crate::sim::report::{Failure, Trace};
use crate::sim::world::World;

use super::io::Faults;

/// The words of the webhook the simulation's denial fault plays.
pub const WEBHOOK: &str = "ids.example.com";

/// Whether the admission webhook of the denial fault turns `id` away: a third of the ids,
/// so a batch holds both kinds.
pub fn webhook_denies(faults: Faults, id: u32) -> bool {
    faults.webhook_denies && id.is_multiple_of(3)
}

/// One batch's IO: the world behind cells, since the executor's calls take `&self`.
pub struct SimWrites<'a> {
    idx: usize,
    world: RefCell<&'a mut World>,
    log: &'a SimLog,
    rng: RefCell<&'a mut Rng>,
    trace: RefCell<&'a mut Trace>,
    faults: Faults,
    stopped: Cell<bool>,
    /// Requests the server refused (401, 403 from RBAC) in this batch.
    pub refusals: Cell<u32>,
    /// Requests the server pushed back (429, API Priority and Fairness) in this batch.
    pub throttles: Cell<u64>,
    /// The first invariant a write broke.
    pub broke: RefCell<Option<Failure>>,
    /// How often each request was made in this batch, 429s aside (`tried`).
    tries: RefCell<BTreeMap<(&'static str, u32), u32>>,
    /// The executor's waits in this batch.
    sleeps: Cell<u32>,
}

/// More waits than any batch makes: a batch's waits are a few steps each for its retries
/// and the few 429s it meets.
const MOST_SLEEPS: u32 = 100_000;

/// The most times one request (a create, read or delete of one id) is made in one batch,
/// 429s aside, which are waited out and never an attempt: the executor's bound.
fn most_tries() -> u32 {
    ApplyOptions::default().max_attempts
}

fn status(code: u16, reason: &str, message: String) -> RequestError {
    RequestError::status(code, reason, message)
}

impl<'a> SimWrites<'a> {
    pub fn new(
        idx: usize,
        world: &'a mut World,
        log: &'a SimLog,
        (rng, faults, trace): (&'a mut Rng, Faults, &'a mut Trace),
    ) -> Self {
        SimWrites {
            idx,
            world: RefCell::new(world),
            log,
            rng: RefCell::new(rng),
            trace: RefCell::new(trace),
            faults,
            stopped: Cell::new(false),
            refusals: Cell::new(0),
            throttles: Cell::new(0),
            broke: RefCell::new(None),
            tries: RefCell::new(BTreeMap::new()),
            sleeps: Cell::new(0),
        }
    }

    /// Counts a request the server answers with `answer` (a 429 is no attempt). One made
    /// more often than the executor's bound breaks an invariant and stops the batch: a
    /// retry with no end would otherwise hang the seed, not fail it.
    fn tried(&self, verb: &'static str, id: u32, answer: Option<&RequestError>) {
        if answer.is_some_and(RequestError::is_throttled) {
            return;
        }
        let mut tries = self.tries.borrow_mut();
        let n = tries.entry((verb, id)).or_insert(0);
        *n += 1;
        if *n > most_tries() {
            let i = self.idx;
            self.broke.borrow_mut().get_or_insert(Failure::new(
                "a request is made at most as often as the executor's retries allow",
                format!(
                    "i{i} made {verb} {id} {n} times in one batch (at most {})",
                    most_tries()
                ),
            ));
            self.stopped.set(true);
        }
    }

    fn say(&self, s: String) {
        let now = self.world.borrow().now;
        self.trace.borrow_mut().line(now, s);
    }

    /// What the server answers any request now, before looking at the object.
    fn fault(&self, verb: &str) -> Option<RequestError> {
        if self.faults.creates_refused {
            self.refusals.set(self.refusals.get() + 1);
            return Some(status(
                403,
                "Forbidden",
                format!(
                    "ciliumidentities.cilium.io is forbidden: User \"system:serviceaccount:kube-system:cilium-idmig\" cannot {verb} resource \"ciliumidentities\" in API group \"cilium.io\" at the cluster scope"
                ),
            ));
        }
        if self.faults.flaky && self.rng.borrow_mut().chance(0.03) {
            // API Priority and Fairness pushing back: waited out, never an attempt.
            self.throttles.set(self.throttles.get() + 1);
            return Some(RequestError::Status {
                code: 429,
                plain: false,
                reason: "TooManyRequests".into(),
                message: "too many requests, please try again later".into(),
                retry_after: Some(std::time::Duration::from_secs(1)),
            });
        }
        if self.faults.server_down || (self.faults.flaky && self.rng.borrow_mut().chance(0.05)) {
            return Some(status(
                500,
                "InternalError",
                "etcdserver: leader changed".into(),
            ));
        }
        None
    }
}

impl IdentityWrites for SimWrites<'_> {
    async fn create(&self, id: u32, labels: &SecurityLabels) -> Result<Written, RequestError> {
        let i = self.idx;
        let fault = self.fault("create");
        self.tried("create", id, fault.as_ref());
        if let Some(e) = fault {
            self.say(format!("i{i} create {id}: {}", e.code().unwrap_or(0)));
            return Err(e);
        }
        if webhook_denies(self.faults, id) {
            self.say(format!("i{i} create {id} denied"));
            return Err(status(
                400,
                "BadRequest",
                format!(
                    "admission webhook \"{WEBHOOK}\" denied the request: id {id} is held for review"
                ),
            ));
        }
        let mut world = self.world.borrow_mut();
        if let Err(f) = world.check_sole_writer(i, &format!("i{i} created {id}")) {
            self.broke.borrow_mut().get_or_insert(f);
            return Err(RequestError::Timeout);
        }
        if world.create_object(id, canonical_key(labels)) {
            world.created_by_sync.insert(id);
            let rv = world.k8s_rv.to_string();
            return Ok(Written {
                uid: format!("uid-{id}-{rv}"),
                resource_version: rv,
            });
        }
        Err(status(
            409,
            "AlreadyExists",
            format!("ciliumidentities.cilium.io \"{id}\" already exists"),
        ))
    }

    async fn read(&self, id: u32) -> Result<Option<Existing>, RequestError> {
        let fault = self.fault("get");
        self.tried("get", id, fault.as_ref());
        if let Some(e) = fault {
            return Err(e);
        }
        let world = self.world.borrow();
        Ok(world.objects.get(&id).map(|(labels, rv)| Existing {
            written: Written {
                uid: format!("uid-{id}-{rv}"),
                resource_version: rv.to_string(),
            },
            labels: parse_label_key(labels)
                .map(|l| to_security_labels(&l))
                .unwrap_or_default(),
            // The simulation loses no create's answer: an object found is another's.
            this_run: false,
        }))
    }

    async fn delete(&self, id: u32, expected: &Written) -> Result<(), RequestError> {
        let fault = self.fault("delete");
        self.tried("delete", id, fault.as_ref());
        if let Some(e) = fault {
            return Err(e);
        }
        let mut world = self.world.borrow_mut();
        match world.objects.get(&id) {
            None => Err(status(404, "NotFound", format!("\"{id}\" not found"))),
            Some((_, rv)) if rv.to_string() != expected.resource_version => Err(status(
                409,
                "Conflict",
                "the precondition of the delete did not hold".into(),
            )),
            Some(_) => {
                world.delete_object(id);
                Ok(())
            }
        }
    }

    /// The world's clock does not move inside a batch: the binary's waits pass at once. A
    /// batch that waits without end (a wait that never shrinks) fails its seed rather than
    /// hanging it: a 429's wait is a few steps, and a batch meets a few 429s.
    async fn sleep(&self, _d: Duration) {
        let n = self.sleeps.get() + 1;
        self.sleeps.set(n);
        if n > MOST_SLEEPS {
            let i = self.idx;
            self.broke.borrow_mut().get_or_insert(Failure::new(
                "a batch's waits end",
                format!("i{i} slept {n} times in one batch"),
            ));
            self.stopped.set(true);
        }
    }

    fn held_back(&self) -> Option<&'static str> {
        let gate = self.world.borrow().lease_valid(self.idx);
        write_held_back(self.stopped.get(), Some(gate))
    }

    fn stop(&self) {
        self.stopped.set(true);
    }

    type LogError = String;

    /// Each outcome's line through the binary's writer, onto the disk as it is now.
    fn log(&self, line: Record) -> Result<(), String> {
        let now = self.world.borrow().now;
        self.log.at(now, self.faults.disk_full).append(line)
    }

    fn throttled(&self) -> u64 {
        self.throttles.get()
    }

    fn server(&self) -> String {
        "sim".into()
    }
}

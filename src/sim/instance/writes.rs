//! The simulated API server beneath core's executor (`core::executor::carry_out`), the code
//! the binary runs: each create, read and delete answered at once by the world, with the
//! faults of the moment (a 403 from RBAC, an admission webhook's denial of one object, 500s),
//! every create checked to be the sole writer's, and each outcome logged as the binary logs it.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use crate::core::decision_log::Record;
use crate::core::executor::{Existing, IdentityWrites, Written};
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
        if let Some(e) = self.fault("create") {
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
        if let Some(e) = self.fault("get") {
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
        if let Some(e) = self.fault("delete") {
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

    /// The world's clock does not move inside a batch: the binary's waits pass at once.
    async fn sleep(&self, _d: Duration) {}

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

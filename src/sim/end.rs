//! The end of a simulated rollout: a quiet spell in which every reservation must be made,
//! then the last nodes move, cutover must come within its bound, and every decision that
//! reached sync must have ended in the log.

use super::*;
use crate::core::planner::resume::LogStep;
use crate::sim::log::from_a_screen;
use std::collections::HashMap;

impl Sim {
    /// A tick of the quiet end: everything the watches have delivered, each instance's
    /// batch, check and reservations answered, a settle, and every fifth second the status.
    fn quiet_tick(&mut self, ticks: &mut u64) -> Result<(), Failure> {
        self.excuses();
        for i in 0..self.instances.len() {
            for _ in 0..64 {
                let before = (self.instances[i].kv_pos, self.instances[i].k8s_pos);
                self.deliver_kv(i)?;
                self.deliver_k8s(i)?;
                if (self.instances[i].kv_pos, self.instances[i].k8s_pos) == before {
                    break;
                }
            }
            self.batch_done(i)?;
            self.verify_done(i)?;
            self.reservations_done(i)?;
        }
        self.settle()?;
        *ticks += 1;
        if ticks.is_multiple_of(STATUS.as_millis() as u64 / SETTLE.as_millis() as u64) {
            self.status()?;
        }
        Ok(())
    }

    /// Before the last nodes move, the rollout goes quiet with kvstore-mode nodes still
    /// there: no fault, no chaos. Once the Lease has had time to settle and a failure's
    /// wait is over, whoever holds it has reserved every object it has seen.
    fn all_reserved(&mut self) -> Result<(), Failure> {
        if !self.settings.reserve_in_kvstore {
            return Ok(());
        }
        if !reserved::kvstore_in_use(&self.world) {
            // Most rollouts are over by now: a node comes back to kvstore mode and uses it,
            // so there is something to reserve for (after a cutover, anew).
            self.world.nodes[0].mode = world::Mode::Kvstore;
            let l = labels(self.rng.below(LABEL_SETS as u64) as usize);
            self.world.kvstore_allocate(&mut self.rng, 0, &l);
            self.trace.line(
                self.world.now,
                "node 0 returns to kvstore mode for the quiet end",
            );
        }
        let until = self.world.now + LEASE_DURATION * 2 + RETRY_AFTER_FAILURE;
        let mut ticks = 0;
        while self.world.now < until {
            self.quiet_tick(&mut ticks)?;
        }
        for inst in &self.instances {
            if reserved::excuse(inst, &self.world, self.faults).is_some() {
                continue;
            }
            let left = inst.unreserved(&self.world);
            if !left.is_empty() {
                return Err(Failure::new(
                    "every object is reserved in the kvstore within two of the writer's turns, unless sync says why not",
                    format!(
                        "i{}: after a quiet {} s with the Lease held, {left:?} still not reserved",
                        inst.idx,
                        (LEASE_DURATION * 2 + RETRY_AFTER_FAILURE).as_secs()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every create the operator decided and that reached instance `i` (which reached
    /// cutover) ended in its log: written, refused with the reason, or closed as moot;
    /// unless its identity left the kvstore (or changed labels) since, or a later decision
    /// or undo took it back. Read from the log and the world, not from the machine.
    fn check_decisions_carried_out(&self, i: usize) -> Result<(), Failure> {
        // Each log read whole from its bytes, as the binary reads a file, is what every
        // start and check read line by line: the logs moved away from too, and the
        // decisions file.
        for (n, log) in self.logs.iter().enumerate() {
            let logs = log.chain().count();
            for (k, moved) in log.chain().enumerate() {
                let torn_ok = k + 1 < logs;
                moved.reads_back(torn_ok).map_err(|why| {
                    Failure::new(
                        "the decision log reads back as it was written",
                        format!("i{n} (log {k}): {why}"),
                    )
                })?;
            }
        }
        if let Some(file) = &self.file {
            file.log.reads_back(false).map_err(|why| {
                Failure::new(
                    "the decision log reads back as it was written",
                    format!("the decisions file: {why}"),
                )
            })?;
        }
        // Every log the instance wrote, those it moved away from first: a decision made
        // before a move may be carried out after it.
        let logs: Vec<_> = self.logs[i].chain().map(|l| l.records()).collect();
        let log: Vec<&crate::core::decision_log::Record> =
            logs.iter().flat_map(|l| l.iter()).collect();
        // The last line about each identity: a line after a decision ends it.
        let last: HashMap<&str, usize> = log
            .iter()
            .enumerate()
            .map(|(at, l)| (l.id.as_str(), at))
            .collect();
        for (at, line) in log.iter().enumerate() {
            // An operator's decision to create, made on a screen, as the binary's log
            // records it (not the line sync writes before carrying a decision out).
            let (true, Some(LogStep::Decide(d))) = (from_a_screen(line), line.step()) else {
                continue;
            };
            if d.action != Action::Create {
                continue;
            }
            // Any later line about it: another decision, an undo, the write's decision
            // line, a refusal, a moot closing, an outcome.
            let ended = last.get(d.id.as_str()).is_some_and(|&l| l > at);
            let still = self.world.masters.get(&d.id) == Some(&d.labels);
            // Served already: its target holds its labels (made before, by whoever).
            let served = d
                .target_id
                .and_then(|t| self.world.objects.get(&t))
                .is_some_and(|(l, _)| *l == d.labels);
            if !ended && still && !served {
                return Err(Failure::new(
                    "every decision that reaches sync ends in a logged outcome",
                    format!(
                        "i{i}: the decision on {} ({:?} at {:?}) has nothing after it in the log",
                        d.id, d.action, d.target_id
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The end of the rollout: every node moves to CRD mode, the faults end, and events are
    /// delivered as they come; cutover must come within the grace plus two checks (and the
    /// time a Lease takes to pass, and a retry's wait).
    pub(super) fn finish(&mut self) -> Result<(), Failure> {
        while !self.mail.is_empty() {
            self.deliver()?;
        }
        self.quiet = true;
        self.world.quiet = true;
        let denied = self.faults.webhook_denies;
        self.faults = Faults::default();
        if denied {
            self.faults.webhook_denies = true;
            self.lift_denials()?;
        }
        self.renewals_fail.iter_mut().for_each(|f| *f = false);
        self.all_reserved()?;
        for n in 0..self.world.nodes.len() {
            self.world.roll(n);
        }
        self.trace.line(self.world.now, "the rollout is over");
        let start = self.world.now;
        let bound = GRACE + VERIFY_EVERY * 2 + LEASE_DURATION + crate::core::sync::RETRY_AFTER;
        // Once cutover stands, the rollout's end runs this much longer before the decisions
        // are checked: one made late (after a cutover announced earlier) is written within it.
        let late = crate::core::sync::RETRY_AFTER;
        let (mut ticks, mut standing) = (0u64, None);
        while self.world.now < start + bound + late {
            self.quiet_tick(&mut ticks)?;
            // A cutover that stands (one a node coming back undid is not it).
            let holder = self.world.lease_holder().filter(|&h| {
                let inst = &self.instances[h];
                inst.cutover.is_some() && inst.shell.machine().cutover_announced()
            });
            match holder {
                Some(h) => {
                    let since = *standing.get_or_insert(self.world.now);
                    if self.world.now >= since + late {
                        return self.check_decisions_carried_out(h);
                    }
                }
                None => standing = None,
            }
        }
        Err(Failure::new(
            "cutover comes once the rollout is over",
            format!(
                "no cutover {} s after the last node moved; {}",
                bound.as_secs(),
                self.instances
                    .iter()
                    .map(|i| {
                        let wait = &i.shell.machine().state().status().cutover_wait;
                        // The item behind the first problem, as this instance plans it.
                        let first = match wait {
                            Some(crate::core::sync::CutoverWait::Verify { first, .. }) => {
                                first.split(' ').next().unwrap_or_default().to_string()
                            }
                            _ => String::new(),
                        };
                        let item = i
                            .shell
                            .machine()
                            .state()
                            .planned_items()
                            .into_iter()
                            .find(|it| it.id == first)
                            .map(|it| {
                                format!(
                                    " ({} {:?} {:?} -> {:?}, decided {}, moot {}, reused {:?})",
                                    it.id,
                                    it.kind,
                                    it.action,
                                    it.target_id,
                                    it.decided,
                                    i.shell.machine().state().is_moot(&it.id),
                                    i.shell.machine().state().reused().get(&it.id)
                                )
                            })
                            .unwrap_or_default();
                        format!("i{}: {wait:?}{item}", i.idx)
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ))
    }
}

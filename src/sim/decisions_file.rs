//! The decisions file (`sync --decisions`) in the simulation: an operator on a bastion writes
//! decisions and undos into it now and then, some dated ten minutes ahead of the machine's
//! clock; every instance follows it through core's `Follower` (the binary's) at each status
//! tick, as the binary reads it every 5 s, logging each change before carrying it; a
//! restart merges it through core's `resume`. Checked: a decision made on this machine after
//! a file line dated ahead was carried stays in force across a restart.

use std::time::Duration;

use super::file_state::AHEAD;
use super::*;
use crate::core::decision_log::file::{DecisionChange, FileRead};
use crate::core::decision_log::{decision_record, in_force};

impl Sim {
    /// The status tick's turn of the file: the operator writes now and then, every
    /// instance reads it, and a screen overrides a line dated ahead once it was carried.
    pub(super) fn decisions_file_tick(&mut self) -> Result<(), Failure> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        // Once the rollout is over the operator writes no more: cutover's bound is for a
        // rollout nobody changes (an undo then opens a conflict again, and its wait).
        if !self.quiet && file.rng.chance(0.3) {
            self.write_file_line();
        }
        for i in 0..self.instances.len() {
            self.follow_file(i)?;
        }
        self.override_ahead()
    }

    /// The operator on the bastion decides a conflict an instance has waiting (or undoes a
    /// decision the file holds), sometimes on a clock ten minutes ahead.
    fn write_file_line(&mut self) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let i = file.rng.below(self.instances.len() as u64) as usize;
        let ahead = file.rng.chance(0.3);
        let undo = file.rng.chance(0.2);
        let at = self.world.now + if ahead { AHEAD } else { Duration::ZERO };
        let item = if undo {
            let decided: Vec<LoggedDecision> = match file.log.contents() {
                Ok(c) => in_force(&[&*c]).into_values().map(|(d, _)| d).collect(),
                Err(_) => Vec::new(),
            };
            file.rng.pick(&decided).map(|d| PlanItem {
                decided: false,
                ..item_of(d)
            })
        } else {
            proposal(self.instances[i].shell.machine().state(), &mut file.rng)
        };
        let Some(item) = item else {
            return;
        };
        let name = if undo { "undo" } else { "accept" };
        if file
            .log
            .at(at, false)
            .append(decision_record(name, &item))
            .is_err()
        {
            return;
        }
        for j in 0..self.instances.len() {
            file.later_on(j, &item.id);
        }
        if ahead && !undo {
            file.overrides.push((i, item.id.clone(), false));
        }
        let how = if ahead {
            " (its clock 10 min ahead)"
        } else {
            ""
        };
        self.trace.line(
            self.world.now,
            format_args!("decisions file: {name} {}{how}", item.id),
        );
    }

    /// Instance `i` reads the file again, as the binary's follower does: each change logged
    /// in its log, then carried to the machine.
    fn follow_file(&mut self, i: usize) -> Result<(), Failure> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let inst = &mut self.instances[i];
        let Some(follower) = inst.follower.as_mut().filter(|_| inst.alive) else {
            return Ok(());
        };
        let len = file.log.written();
        if file.seen.insert(i, len) == Some(len) {
            return Ok(());
        }
        let log = &self.logs[i];
        let (now, full) = (self.world.now, self.faults.disk_full);
        let mut append = |r| log.at(now, full).append(r);
        // Read as the binary's reader read each line of it.
        let parse = |_: &[u8]| file.log.contents().map(|c| c.clone());
        let bytes = file.log.bytes();
        let read = follower.read_again(Some(bytes), parse, &mut append);
        let Some(FileRead::Changed { logged, not_logged }) = read else {
            return match read {
                Some(FileRead::Unreadable(why)) => Err(Failure::new(
                    "the decisions file the operator writes reads back",
                    why,
                )),
                _ => Ok(()),
            };
        };
        if let Some(t) = not_logged {
            self.trace.line(now, format_args!("i{i} {t}"));
        }
        for change in logged {
            let input = match change {
                DecisionChange::Decided(d) => {
                    if let Some(file) = self.file.as_mut() {
                        for o in &mut file.overrides {
                            if o.0 == i && o.1 == d.id {
                                o.2 = true;
                            }
                        }
                    }
                    self.trace
                        .line(now, format_args!("i{i} carries {} from the file", d.id));
                    Input::Decided(d)
                }
                DecisionChange::Undone(id) => {
                    self.trace.line(
                        now,
                        format_args!("i{i} carries the undo of {id} from the file"),
                    );
                    Input::Undone(id)
                }
            };
            self.feed(i, Turn::Input(input))?;
        }
        Ok(())
    }

    /// A file line dated ahead was carried: the operator at this machine decides otherwise
    /// (the line's skip made an accept, or its accept a skip), later than the carry by this
    /// machine's clock, though earlier than the line's own date. A restart must keep it.
    fn override_ahead(&mut self) -> Result<(), Failure> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let Some(at) = file.overrides.iter().position(|o| o.2) else {
            return Ok(());
        };
        let (i, id, _) = file.overrides.remove(at);
        let state = self.instances[i].shell.machine().state();
        let Some(item) = state.planned_items().into_iter().find(|it| it.id == id) else {
            return Ok(());
        };
        let decided = self.instances[i].shell.machine().decisions().in_force();
        let (action, target_id) = match decided.get(&id) {
            Some(d) if d.action != Action::Skip => (Action::Skip, None),
            _ => (item.action, item.target_id),
        };
        if action == Action::None {
            return Ok(());
        }
        let item = PlanItem {
            action,
            target_id,
            decided: true,
            ..item
        };
        let now = self.world.now;
        let line = decision_record(
            if action == Action::Skip {
                "skip"
            } else {
                "accept"
            },
            &item,
        );
        if self.logs[i]
            .at(now, self.faults.disk_full)
            .append(line)
            .is_err()
        {
            return Ok(());
        }
        let d = LoggedDecision {
            id: item.id.clone(),
            labels: item.labels.clone(),
            action,
            target_id,
        };
        for j in 0..self.instances.len() {
            file.later_on(j, &id);
        }
        file.kept.push((i, id.clone(), d.clone()));
        self.trace.line(
            now,
            format_args!("operator overrides {id} after the file's line dated ahead: {action:?}"),
        );
        self.feed(i, Turn::Input(Input::Decided(d)))
    }

    /// A screen's decision on `id` reached instance `i`: what the file expected of it is
    /// moot.
    pub(super) fn screen_decided(&mut self, i: usize, id: &str) {
        if let Some(file) = self.file.as_mut() {
            file.later_on(i, id);
        }
    }

    /// After instance `i` started again: each decision made here after a file line dated
    /// ahead is still in force.
    pub(super) fn kept_across_restart(&mut self, i: usize) -> Result<(), Failure> {
        let Some(file) = self.file.as_ref() else {
            return Ok(());
        };
        let in_force = self.instances[i].shell.machine().decisions().in_force();
        for (j, id, d) in &file.kept {
            if *j == i && in_force.get(id) != Some(d) {
                return Err(Failure::new(
                    "a decision made on this machine after a decisions-file line dated ahead stays in force across a restart",
                    format!(
                        "i{i}: {id} was decided {d:?} after the file's line was carried; after the restart {:?} is in force",
                        in_force.get(id)
                    ),
                ));
            }
        }
        Ok(())
    }
}

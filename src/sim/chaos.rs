//! The steps of a rollout in progress, one drawn from the seed at a time: agents allocating,
//! watches delivering, rounds settling, nodes rolling both ways, both GCs, an operator's
//! decisions, compactions, 410s, renewals failing, crashes and clean stops, permissions
//! taken away, outages and a full disk.

use std::time::Duration;

use super::Sim;
use super::report::Failure;
use super::world::Mode;

impl Sim {
    /// One step of a rollout in progress.
    pub(super) fn chaos(&mut self) -> Result<(), Failure> {
        let i = self.random_instance();
        match self.rng.below(100) {
            0..=19 => self.allocate(),
            20..=34 => self.deliver_kv(i),
            35..=49 => self.deliver_k8s(i),
            50..=61 => self.settle(),
            62..=66 => self.status(),
            67..=74 => self.batch_done(i),
            75..=78 => self.verify_done(i),
            79..=80 => {
                self.roll_a_node();
                Ok(())
            }
            81 => {
                self.world.kv_gc(&mut self.rng);
                Ok(())
            }
            82 => {
                if let Some(id) = self.world.both_gcs(&mut self.rng) {
                    self.trace
                        .line(self.world.now, format_args!("both GCs take identity {id}"));
                }
                Ok(())
            }
            83 => {
                self.k8s_gc();
                Ok(())
            }
            84..=86 => self.decide(i),
            87 => self.deliver(),
            88 => {
                self.world.kv_compacted = self.world.kv_rev;
                self.trace.line(self.world.now, "etcd compacted");
                Ok(())
            }
            89 => {
                self.world.k8s_window = self.world.k8s_rv;
                self.trace
                    .line(self.world.now, "watch cache window moved (410s)");
                Ok(())
            }
            90..=91 => {
                self.flip_renewals(i);
                Ok(())
            }
            92 if self.rng.chance(0.5) => self.stop_and_restart(i),
            92 => self.crash(i),
            93 => {
                self.world.malformed(&mut self.rng);
                Ok(())
            }
            95..=96 => self.reservations_done(i),
            94 => self.fault_turns(),
            _ => {
                self.world.now += Duration::from_millis(200 + self.rng.below(3000));
                Ok(())
            }
        }
    }

    /// A node rolls: now and then one back to kvstore mode, else one on to CRD mode.
    fn roll_a_node(&mut self) {
        let back = self.rng.chance(0.15);
        let from = if back { Mode::Crd } else { Mode::Kvstore };
        let from_mode: Vec<usize> = (0..self.world.nodes.len())
            .filter(|n| self.world.nodes[*n].mode == from)
            .collect();
        let Some(&n) = self.rng.pick(&from_mode) else {
            return;
        };
        if back {
            self.trace.line(
                self.world.now,
                format_args!("node {n} returns to kvstore mode"),
            );
            self.world.nodes[n].mode = Mode::Kvstore;
        } else {
            self.trace
                .line(self.world.now, format_args!("node {n} moves to CRD mode"));
            self.world.roll(n);
        }
    }

    /// Instance `i`'s Lease renewals start or stop failing (a stalled API server).
    fn flip_renewals(&mut self, i: usize) {
        self.renewals_fail[i] = !self.renewals_fail[i];
        let how = if self.renewals_fail[i] {
            "fail"
        } else {
            "work"
        };
        self.trace
            .line(self.world.now, format_args!("i{i} lease renewals {how}"));
    }

    /// A fault comes or goes: now and then a permission taken away (granted again when a
    /// sync ends on it) or an admission webhook's rule put in or changed, else the API
    /// server down or back, or the disk full or freed.
    fn fault_turns(&mut self) -> Result<(), Failure> {
        if self.rng.chance(0.1) {
            // A rule of sync's ClusterRole (create, list, watch), of its Lease Role, or its
            // etcd role's read of the prefix; or a webhook that denies some ids.
            match self.rng.below(6) {
                0 => self.faults.creates_refused = true,
                1 => self.faults.lease_refused = true,
                2 => self.faults.lists_refused = true,
                3 => self.faults.watches_refused = true,
                4 => self.faults.kv_reads_refused = true,
                _ if self.faults.webhook_denies => return self.lift_denials(),
                _ => self.faults.webhook_denies = true,
            }
        } else if self.rng.chance(0.5) {
            self.faults.server_down = !self.faults.server_down;
        } else {
            self.faults.disk_full = !self.faults.disk_full;
        }
        self.trace
            .line(self.world.now, format_args!("faults {:?}", self.faults));
        Ok(())
    }
}

//! The preparation on small clusters: what it creates, where, what it removes, what it
//! leaves alone, and that the report after it finds nothing to draw.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::core::switch::report::tests::{full_set, identity, pod, report_with};

struct Cluster {
    pods: Vec<crate::core::switch::computed::PodFacts>,
    identities: Vec<ExistingIdentity>,
    endpoints: BTreeMap<String, u32>,
}

impl Cluster {
    fn report(&self) -> SwitchReport {
        report_with(&self.pods, &self.identities, &self.endpoints)
    }

    fn prepare(&self, kvstore_ids: &[u32], options: PrepareOptions) -> PreparePlan {
        let kv = KvstoreHolds {
            ids: kvstore_ids.iter().copied().collect(),
            nodes: BTreeSet::new(),
        };
        self.prepare_with(&kv, options)
    }

    fn prepare_with(&self, kv: &KvstoreHolds, options: PrepareOptions) -> PreparePlan {
        prepare(&PrepareInput {
            report: &self.report(),
            identities: &self.identities,
            kvstore: kv,
            endpoint_ids: &self.endpoints.values().copied().collect(),
            range: range(),
            options,
        })
    }

    /// The plan carried out, as the API server would hold it.
    fn carry_out(&mut self, plan: &PreparePlan) {
        let gone: BTreeSet<u32> = plan.removals.iter().map(|r| r.id).collect();
        self.identities.retain(|i| !gone.contains(&i.id));
        for c in &plan.creates {
            assert!(
                self.identities.iter().all(|i| i.id != c.id),
                "{} is taken",
                c.id
            );
            self.identities
                .push(identity(c.id, c.labels.clone(), 1_700_000_000, true));
        }
    }
}

fn range() -> IdRange {
    IdRange::for_cluster(0).expect("range")
}

const OLD: i64 = 1_577_836_800;

#[test]
fn each_label_set_the_switch_would_draw_gets_one_identity_at_a_free_id_from_the_top() {
    let mut lacking = full_set("api");
    lacking.remove("k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name");
    let mut c = Cluster {
        pods: vec![
            pod("shop", "api-1", "api"),
            pod("shop", "api-2", "api"),
            pod("shop", "new-1", "new"),
            pod("shop", "web-1", "web"),
        ],
        identities: vec![
            identity(1000, full_set("web"), OLD, true),
            identity(1001, lacking, OLD, true),
            identity(65534, full_set("other"), OLD, false),
        ],
        endpoints: [
            ("shop/api-1".to_string(), 1001),
            ("shop/x".to_string(), 65533),
        ]
        .into(),
    };
    // 65535 is held in the kvstore (a reservation), 65534 by an identity, 65533 by an
    // endpoint: the first free id is 65532.
    let plan = c.prepare(&[65535], PrepareOptions::default());
    let made: Vec<(u32, Vec<String>)> = plan
        .creates
        .iter()
        .map(|c| (c.id, c.pods.clone()))
        .collect();
    assert_eq!(
        made,
        vec![
            (
                65532,
                vec!["shop/api-1".to_string(), "shop/api-2".to_string()]
            ),
            (65531, vec!["shop/new-1".to_string()]),
        ]
    );
    assert_eq!(plan.creates[0].labels, full_set("api"));
    assert!(
        plan.creates[0]
            .because
            .contains("the nearest identity 1001 lacks"),
        "{}",
        plan.creates[0].because
    );
    assert!(plan.removals.is_empty());
    assert!(plan.advice[0].contains("1 unused identities were not created by this tool"));

    c.carry_out(&plan);
    let after = c.report();
    assert_eq!(after.counts.label_sets_drawn, 0, "{:?}", after.pods);
    assert_eq!(after.counts.adopted, 4);
    // api-1's endpoint still names 1001: its pod's labels are not 1001's.
    assert_eq!(after.counts.endpoints_moving, 1);
    assert!(c.prepare(&[65535], PrepareOptions::default()).is_empty());
}

#[test]
fn a_duplicate_keeps_what_the_endpoints_use_and_removes_only_this_tools_others() {
    let c = Cluster {
        pods: vec![pod("shop", "web-1", "web"), pod("shop", "db-1", "db")],
        identities: vec![
            identity(1000, full_set("web"), OLD, false),
            identity(1001, full_set("web"), OLD + 10, true),
            identity(2000, full_set("db"), OLD, true),
            identity(2001, full_set("db"), OLD + 10, false),
            identity(2002, full_set("db"), OLD + 20, true),
        ],
        endpoints: [("shop/web-1".to_string(), 1001)].into(),
    };
    let later = PrepareOptions {
        now: OLD + 7200,
        ..PrepareOptions::default()
    };
    let plan = c.prepare(&[], later);
    let removed: Vec<u32> = plan.removals.iter().map(|r| r.id).collect();
    // web: the endpoint uses this tool's 1001, and 1000 is not this tool's: nothing removed
    // there, and the operator is told what may happen. db: none is used, the oldest (2000)
    // is kept, this tool's 2002 goes, 2001 is not this tool's.
    assert_eq!(removed, vec![2002]);
    assert_eq!(plan.removals[0].uid, "uid-2002");
    assert!(
        plan.removals[0].why.contains("a duplicate of 2000"),
        "{}",
        plan.removals[0].why
    );
    let advice = plan.advice.join("\n");
    assert!(advice.contains("identities 1000 hold"), "{advice}");
    assert!(advice.contains("identities 2001 hold"), "{advice}");
    assert!(plan.creates.is_empty());
}

#[test]
fn this_tools_unused_identities_go_only_when_asked_and_after_the_grace() {
    let now = OLD + 7200;
    let c = Cluster {
        pods: vec![],
        identities: vec![
            identity(3000, full_set("a"), OLD, true),
            identity(3001, full_set("b"), now - 60, true),
            identity(3002, full_set("c"), OLD, false),
        ],
        endpoints: BTreeMap::new(),
    };
    assert!(
        c.prepare(
            &[],
            PrepareOptions {
                remove_unused_after: None,
                now,
                endpoints_unknown: false,
            }
        )
        .removals
        .is_empty()
    );
    let plan = c.prepare(
        &[],
        PrepareOptions {
            remove_unused_after: Some(3600),
            now,
            endpoints_unknown: false,
        },
    );
    let removed: Vec<u32> = plan.removals.iter().map(|r| r.id).collect();
    assert_eq!(
        removed,
        vec![3000],
        "3001 is younger than the grace, 3002 not ours"
    );
}

#[test]
fn a_full_range_says_how_many_label_sets_are_left_without() {
    let small = IdRange { min: 256, max: 257 };
    let c = Cluster {
        pods: vec![
            pod("shop", "a", "a"),
            pod("shop", "b", "b"),
            pod("shop", "c", "c"),
        ],
        identities: vec![],
        endpoints: BTreeMap::new(),
    };
    let kv = KvstoreHolds::default();
    let plan = prepare(&PrepareInput {
        report: &c.report(),
        identities: &c.identities,
        kvstore: &kv,
        endpoint_ids: &BTreeSet::new(),
        range: small,
        options: PrepareOptions::default(),
    });
    assert_eq!(plan.creates.len(), 2);
    assert_eq!(plan.no_free_id, 1);
}

#[test]
fn with_no_endpoint_known_nothing_is_removed() {
    let c = Cluster {
        pods: vec![pod("shop", "db-1", "db")],
        identities: vec![
            identity(2000, full_set("db"), OLD, true),
            identity(2001, full_set("db"), OLD + 10, true),
            identity(3000, full_set("a"), OLD, true),
        ],
        endpoints: BTreeMap::new(),
    };
    let options = PrepareOptions {
        remove_unused_after: Some(0),
        now: OLD + 7200,
        endpoints_unknown: true,
    };
    let plan = c.prepare(&[], options);
    assert!(plan.removals.is_empty(), "{:?}", plan.removals);
    assert!(
        plan.advice[0].contains("nothing is removed"),
        "{:?}",
        plan.advice
    );
    let known = c.prepare(
        &[],
        PrepareOptions {
            endpoints_unknown: false,
            ..options
        },
    );
    let ids: Vec<u32> = known.removals.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![2001, 3000], "the duplicate and the unused one");
}

#[test]
fn nothing_is_written_while_an_agent_allocates_from_the_kvstore_and_its_ids_stay() {
    let c = Cluster {
        pods: vec![pod("shop", "new-1", "new"), pod("shop", "db-1", "db")],
        identities: vec![
            identity(2000, full_set("db"), OLD, true),
            identity(2001, full_set("db"), OLD + 10, true),
        ],
        endpoints: BTreeMap::new(),
    };
    let options = PrepareOptions {
        remove_unused_after: Some(0),
        now: OLD + 7200,
        endpoints_unknown: false,
    };
    // An agent on the kvstore (node 10.0.0.9) holds 65535 by its value/ key.
    let kv = KvstoreHolds {
        ids: BTreeSet::from([2001, 65535]),
        nodes: BTreeSet::from(["10.0.0.9".to_string()]),
    };
    let plan = c.prepare_with(&kv, options);
    assert_eq!(
        plan.creates[0].id, 65534,
        "not on the id its value/ key names"
    );
    assert!(plan.removals.is_empty(), "2001 is the kvstore's: {plan:?}");
    assert!(
        plan.advice
            .join("\n")
            .contains("identities 2001 are kept while agents")
    );
    let why = plan.refuse_while_agents_on_kvstore().expect("refused");
    assert!(
        why.contains("1 node still allocates from the kvstore (10.0.0.9)"),
        "{why}"
    );
    // Every agent in CRD mode: the duplicate goes, and nothing is refused.
    let clear = KvstoreHolds {
        nodes: BTreeSet::new(),
        ..kv.clone()
    };
    let plan = c.prepare_with(&clear, options);
    assert_eq!(plan.removals.len(), 1);
    assert_eq!(plan.removals[0].of, RemovalOf::Duplicate);
    assert_eq!(plan.refuse_while_agents_on_kvstore(), None);
    // Read again just before the writes: an agent came, or took an id to create.
    assert_eq!(plan.kvstore_moved(&clear), None);
    assert!(plan.kvstore_moved(&kv).is_some());
    let taken = KvstoreHolds {
        ids: BTreeSet::from([plan.creates[0].id]),
        nodes: BTreeSet::new(),
    };
    let why = plan.kvstore_moved(&taken).expect("taken");
    assert!(why.contains("the kvstore took 65534"), "{why}");
}

#[test]
fn a_duplicate_younger_than_the_grace_is_kept_and_a_grace_past_any_age_removes_nothing() {
    let now = OLD + 7200;
    let c = Cluster {
        pods: vec![pod("shop", "db-1", "db")],
        identities: vec![
            identity(2000, full_set("db"), OLD, true),
            identity(2001, full_set("db"), now - 60, true),
            identity(3000, full_set("a"), OLD, true),
        ],
        endpoints: BTreeMap::new(),
    };
    let default = PrepareOptions {
        now,
        ..PrepareOptions::default()
    };
    let plan = c.prepare(&[], default);
    assert!(plan.removals.is_empty(), "{:?}", plan.removals);
    assert!(
        plan.advice
            .join("\n")
            .contains("identities 2001 are younger than the grace (3600 s for a duplicate)")
    );
    let asked = |secs| PrepareOptions {
        remove_unused_after: Some(secs),
        ..default
    };
    let ids = |p: PreparePlan| p.removals.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(c.prepare(&[], asked(30))), vec![2001, 3000]);
    assert_eq!(ids(c.prepare(&[], asked(i64::MAX))), Vec::<u32>::new());
    // A creation time ahead of this clock is young, not a wrap.
    let odd = PrepareOptions {
        now: i64::MIN + 1,
        ..asked(i64::MAX)
    };
    assert!(c.prepare(&[], odd).removals.is_empty());
}

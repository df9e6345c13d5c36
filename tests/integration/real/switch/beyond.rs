//! The switch beyond one cluster with id 0, proven with Cilium's own code on the real server:
//! a mesh cluster (id 3, with 511 and with 255 clusters), endpoints kept in slices, a
//! kvstore that held one label set under two ids, and an agent still on the kvstore.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{CILIUM_CONFIG, P, Scenario, endpoint, label_key, namespace_with_pods};
use super::{operator_set, run_controller};
use crate::harness::Etcd;
use crate::support::control_plane::{ControlPlane, cilium_bin, skip};

/// The report's id for each pod that is adopted (every pod but those in the host's network,
/// once prepared), and that nothing else is said of any.
fn adopted(report: &serde_json::Value) -> BTreeMap<String, u32> {
    report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["outcome"] != "host-network")
        .map(|p| {
            assert_eq!(p["outcome"], "adopted", "{p}");
            let id = p["id"].as_u64().unwrap() as u32;
            (p["pod"].as_str().unwrap().to_string(), id)
        })
        .collect()
}

/// Prepared with `prepare`, the report then safe, Cilium 1.18's controller run with `flags`:
/// it creates and rewrites nothing, and every pod lands on the id the report named.
async fn prepared_and_adopted(sc: &Scenario, prepare: &[&str], flags: &[&str]) {
    let log = sc.dir.path().join("prepare.jsonl").display().to_string();
    let args = [
        &["switch-prepare", "--decision-log", &log, "--yes"],
        prepare,
    ]
    .concat();
    let r = sc.run(&args).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = sc.report(&["--output", "json"]).await;
    assert_eq!(r.code, 0, "safe now: {}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let named = adopted(&report);
    let run = match run_controller(&sc.cp, sc.dir.path(), named.len(), flags).await {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    };
    assert!(run.created.is_empty(), "created {:?}", run.created);
    assert!(run.updated.is_empty(), "rewrote {:?}", run.updated);
    assert_eq!(run.allocated, named, "each pod on the id the report named");
}

/// A mesh cluster `cluster_id` named `c<id>` of `mcc` clusters: web's identity migrated at
/// its own id in the cluster's range, new-1 and new-2 with none, and 20 old identities.
async fn mesh_cluster(test: &str, cluster_id: u32, mcc: u32) -> Option<(Scenario, u32, u32)> {
    let cp = ControlPlane::start(test)?;
    if let Err(why) = cilium_bin("opsim-1.18") {
        skip(test, &why);
        return None;
    }
    let name = format!("c{cluster_id}");
    cp.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cilium-config, namespace: kube-system}}\ndata: {{cluster-name: {name}, cluster-id: '{cluster_id}', max-connected-clusters: '{mcc}', identity-allocation-mode: crd}}\n"
    ));
    let labels_ns_name = !cp.version().starts_with("v1.19");
    cp.apply(&namespace_with_pods(
        "shop",
        &[("web-1", "web"), ("new-1", "new"), ("new-2", "other")],
    ));
    let (min, max) = match mcc {
        511 => (cluster_id << 15, ((cluster_id + 1) << 15) - 1),
        _ => (cluster_id << 16, ((cluster_id + 1) << 16) - 1),
    };
    let in_cluster = |app: &str| {
        let mut l = operator_set(app, "shop", labels_ns_name);
        l.insert("k8s:io.cilium.k8s.policy.cluster".into(), name.clone());
        l
    };
    let etcd = Etcd::start().await;
    let mut migrated = std::collections::BTreeSet::new();
    for (i, app) in std::iter::once("web".to_string())
        .chain((0..20).map(|i| format!("old-{i}")))
        .enumerate()
    {
        let id = min + 1000 + i as u32;
        etcd.put(
            &format!("{P}/id/{id}"),
            label_key(&in_cluster(&app)).as_bytes(),
        )
        .await;
        migrated.insert(id);
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("migrate.jsonl").display().to_string();
    let (cid, m) = (cluster_id.to_string(), mcc.to_string());
    let args = [
        "apply",
        "--yes",
        "--decision-log",
        &log,
        "--cluster-id",
        &cid,
        "--max-connected-clusters",
        &m,
    ];
    let (r, _) = super::super::cli(dir.path(), &cp.kubeconfig, &etcd, &args, 120).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    Some((
        Scenario {
            cp,
            etcd,
            dir,
            labels_ns_name,
            migrated,
        },
        min,
        max,
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mesh_cluster_is_prepared_in_its_own_range_and_cilium_1_18s_operator_adopts_every_pod() {
    let test = "real::switch::beyond::a_mesh_cluster_is_prepared_in_its_own_range";
    for mcc in [511u32, 255] {
        let Some((sc, min, max)) = mesh_cluster(test, 3, mcc).await else {
            return;
        };
        let r = sc.run(&["switch-prepare", "--output", "json"]).await;
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        let plan: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
        let creates = plan["plan"]["creates"].as_array().unwrap();
        assert_eq!(creates.len(), 2, "new and other: {}", r.stdout);
        for c in creates {
            let id = c["id"].as_u64().unwrap() as u32;
            assert!(
                (min..=max).contains(&id),
                "{mcc}: {id} outside {min}..={max}"
            );
        }
        let flags = [
            "--opsim-cluster-id",
            "3",
            "--opsim-cluster-name",
            "c3",
            "--opsim-max-connected-clusters",
            &mcc.to_string(),
        ];
        prepared_and_adopted(&sc, &[], &flags).await;
        assert_eq!(
            sc.cp.identities().len(),
            sc.migrated.len() + 2,
            "{mcc}: the two prepared beside the migrated"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_endpoints_in_slices_the_prepared_switch_draws_nothing_and_cilium_1_18s_operator_adopts_every_pod()
 {
    let test = "real::switch::beyond::with_endpoints_in_slices";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let cp = &sc.cp;
    sc.serve_slices();
    // A gone pod whose endpoint names 2005 while a stale slice entry names 2006: both ids
    // are in use, neither is removed.
    cp.apply(&endpoint("shop", "gone-1", 2005));
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumEndpointSlice\nmetadata: {name: ces-1}\nnamespace: shop\nendpoints: [{name: web-1, id: 1000}, {name: web-2, id: 1000}, {name: gone-1, id: 2006}]\n",
    );
    let prep = sc.plan_removing_unused().await;
    let removed: Vec<u64> = prep["plan"]["removals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert!(!removed.is_empty(), "the other old ones go: {prep}");
    assert!(
        !removed.contains(&2005) && !removed.contains(&2006),
        "{removed:?}"
    );
    let flags = ["--opsim-enable-ces"];
    prepared_and_adopted(&sc, &["--remove-unused-after", "0s"], &flags).await;
    let left = cp.identities();
    assert!(left.contains_key("2005") && left.contains_key("2006"));
}

#[tokio::test(flavor = "multi_thread")]
async fn endpoints_served_but_empty_while_pods_run_are_not_known_and_nothing_is_removed() {
    let test = "real::switch::beyond::endpoints_served_but_empty";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    sc.cp
        .kubectl(&["delete", "ciliumendpoints", "--all", "-n", "shop"]);
    let prep = sc.plan_removing_unused().await;
    assert_eq!(prep["plan"]["removals"], serde_json::json!([]), "{prep}");
    let known = prep["report"]["settings"]["cannot_know"].to_string();
    assert!(
        known.contains("ciliumendpoints.cilium.io served but empty while 6 pods run"),
        "{known}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_label_set_the_kvstore_held_under_two_ids_is_settled_and_cilium_1_18s_operator_adopts_the_one_kept()
 {
    let test = "real::switch::beyond::a_label_set_the_kvstore_held_under_two_ids";
    let Some(cp) = ControlPlane::start(test) else {
        return;
    };
    if let Err(why) = cilium_bin("opsim-1.18") {
        return skip(test, &why);
    }
    cp.apply(CILIUM_CONFIG);
    let labels_ns_name = !cp.version().starts_with("v1.19");
    cp.apply(&namespace_with_pods(
        "shop",
        &[("web-1", "web"), ("web-2", "web")],
    ));
    // Two agents minted web on their own: 1000 and 1003 hold one label set.
    let etcd = Etcd::start().await;
    let web = label_key(&operator_set("web", "shop", labels_ns_name));
    for id in [1000, 1003] {
        etcd.put(&format!("{P}/id/{id}"), web.as_bytes()).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("migrate.jsonl").display().to_string();
    let args = [
        "apply",
        "--yes",
        "--accept-proposals",
        "--decision-log",
        &log,
    ];
    let (r, _) = super::super::cli(dir.path(), &cp.kubeconfig, &etcd, &args, 120).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    cp.apply(&endpoint("shop", "web-1", 1003));
    let sc = Scenario {
        cp,
        etcd,
        dir,
        labels_ns_name,
        migrated: [1000, 1003].into(),
    };
    let r = sc.report(&["--output", "json"]).await;
    assert_eq!(r.code, 1, "a duplicate: {}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("\"duplicate\""), "{}", r.stdout);
    // The one the endpoint uses is kept, the other (this tool's) goes once past the grace.
    prepared_and_adopted(&sc, &["--remove-unused-after", "0s"], &[]).await;
    let left: Vec<String> = sc.cp.identities().into_keys().collect();
    assert_eq!(left, vec!["1003".to_string()]);
}

/// Cilium 1.9's allocator as one node in kvstore mode, allocating `labels` at `id` or the
/// one below (its pool needs two), until killed: its `value/` key lapses with its lease then.
fn kvstore_agent(dir: &std::path::Path, etcd: &Etcd, labels: &str, id: u32) -> std::process::Child {
    let wl = dir.join("workload-kvstore.txt");
    std::fs::write(&wl, format!("{labels}\n")).unwrap();
    let bin = cilium_bin("allocsim-1.9").unwrap();
    std::process::Command::new(bin)
        .args(["-mode", "kvstore", "-node", "10.0.0.9", "-rate", "0"])
        .args(["-min", &(id - 1).to_string(), "-max", &id.to_string()])
        .args(["-lease-ttl", "5s"])
        .arg("-workload")
        .arg(&wl)
        .arg("-etcd-config")
        .arg(etcd.config_file())
        .env("HOME", dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The `value/` keys the kvstore holds now.
async fn value_keys(etcd: &Etcd) -> usize {
    let mut c = etcd.client().await.unwrap();
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let r = c.get(format!("{P}/value/"), Some(opts)).await.unwrap();
    r.count() as usize
}

async fn wait_for_value_keys(etcd: &Etcd, want: impl Fn(usize) -> bool) {
    let start = Instant::now();
    while !want(value_keys(etcd).await) {
        assert!(start.elapsed() < Duration::from_secs(60), "value/ keys");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_still_on_the_kvstore_is_named_and_nothing_is_written_until_it_leaves() {
    let test = "real::switch::beyond::an_agent_still_on_the_kvstore";
    if let Err(why) = cilium_bin("allocsim-1.9") {
        return skip(test, &why);
    }
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    // Cilium 1.9's agent, still in kvstore mode, draws 65534 or 65535: the top of the range,
    // where switch-prepare takes its first ids.
    let late = "k8s:app=late;k8s:io.kubernetes.pod.namespace=shop;";
    let mut agent = kvstore_agent(sc.dir.path(), &sc.etcd, late, 65535);
    wait_for_value_keys(&sc.etcd, |n| n > 0).await;
    let drawn = {
        let mut c = sc.etcd.client().await.unwrap();
        let got = c
            .get(format!("{P}/value/{late}/10.0.0.9"), None)
            .await
            .unwrap();
        String::from_utf8_lossy(got.kvs()[0].value()).to_string()
    };
    let before = sc.cp.identities();
    let r = sc.run(&["switch-prepare", "--yes"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("1 node still allocates from the kvstore (10.0.0.9)"),
        "{}",
        r.stderr
    );
    assert_eq!(sc.cp.identities(), before, "nothing written");
    let r = sc.run(&["switch-prepare"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("kvstore: 1 node still allocates there (10.0.0.9)"),
        "{}",
        r.stdout
    );
    // The agent leaves the kvstore (its node moves to CRD mode): its key lapses, and the
    // preparation goes ahead around the id it took.
    agent.kill().unwrap();
    agent.wait().unwrap();
    wait_for_value_keys(&sc.etcd, |n| n == 0).await;
    let log = sc.dir.path().join("prepare.jsonl").display().to_string();
    let r = sc
        .run(&["switch-prepare", "--decision-log", &log, "--yes"])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let now = sc.cp.identities();
    assert!(now.len() > before.len(), "{}", r.stdout);
    assert!(
        !now.contains_key(&drawn),
        "the kvstore's {drawn}: {}",
        r.stdout
    );
    let r = sc.run(&["audit"]).await;
    assert!(r.stdout.contains("findings: 0 split,"), "{}", r.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_steps_are_their_own_decisions_in_the_log_and_a_rollback_undoes_every_one() {
    let test = "real::switch::beyond::the_steps_are_their_own_decisions";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let d = sc.dir.path();
    let before = sc.cp.identities();
    let log = d.join("prepare.jsonl");
    let log_arg = log.display().to_string();
    let prep = [
        "switch-prepare",
        "--remove-unused-after",
        "0s",
        "--decision-log",
        &log_arg,
        "--yes",
    ];
    let r = sc.run(&prep).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // Each line names its step, none the planner's create.
    let lines = crate::e2e::log_records(&log);
    let kinds: std::collections::BTreeSet<&str> =
        lines.iter().filter_map(|l| l["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        ["switch-create", "switch-remove-unused"].into(),
        "{lines:?}"
    );
    let after = sc.cp.identities();
    assert!(after.len() < before.len(), "the old ones went");
    // Undone: what it created goes, what it removed comes back at its id with its labels.
    let r = sc.run(&["rollback", "--decision-log", &log_arg]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("to restore (removed by switch-prepare)"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("restore      2000"), "{}", r.stdout);
    let r = sc
        .run(&["rollback", "--decision-log", &log_arg, "--yes"])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("restored "), "{}", r.stdout);
    assert_eq!(sc.cp.identities(), before, "the cluster as it was");
    // Verify replays the step and its undo: every kvstore identity served again, no
    // problem, nothing said removed.
    let migrate = d.join("migrate.jsonl").display().to_string();
    let r = sc
        .run(&["verify", "--decision-log", &migrate, &log_arg])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(!r.stdout.contains("removed"), "{}", r.stdout);
    // The rollback's own lines are undone in turn by a second rollback.
    let r = sc.run(&["rollback", "--decision-log", &log_arg]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(!r.stdout.contains("to restore"), "{}", r.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_keeps_an_identity_an_endpoint_slice_entry_uses() {
    let test = "real::switch::beyond::rollback_keeps_an_identity_an_endpoint_slice_entry_uses";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let cp = &sc.cp;
    sc.serve_slices();
    // Only a slice names 2003 (no CiliumEndpoint does): it is in use all the same.
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumEndpointSlice\nmetadata: {name: ces-9}\nnamespace: shop\nendpoints: [{name: old-3, id: 2003}]\n",
    );
    let migrate = sc.dir.path().join("migrate.jsonl").display().to_string();
    let r = sc.run(&["rollback", "--decision-log", &migrate]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let kept: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("keep")).collect();
    assert!(
        kept.iter()
            .any(|l| l.contains("2003") && l.contains("shop/old-3")),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("delete       2003"), "{}", r.stdout);
}

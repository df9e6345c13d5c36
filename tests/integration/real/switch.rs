//! The switch to operator-managed identities, proven with Cilium 1.18's own identity
//! controller (`opsim-1.18`) on the real server: identities migrated by `apply` from a
//! kvstore minted by older agents, `switch-report` says what the controller will do to each
//! pod, then the controller runs and does exactly that.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

mod beyond;

use super::{apply_everything, cli, cli_no_etcd};
use crate::harness::Etcd;
use crate::support::control_plane::{ControlPlane, cilium_bin, skip};

const P: &str = "cilium/state/identities/v1";

/// A label set as Cilium's kvstore keys hold it: `k8s:` labels sorted, `;` after each.
fn label_key(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v};")).collect()
}

/// What 1.18's operator computes for a pod `app` of namespace `ns` with the `default`
/// service account, on a server that does (1.21+) or does not label namespaces with their
/// name, in cluster `default`.
fn operator_set(app: &str, ns: &str, ns_name_label: bool) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = [
        ("k8s:app", app),
        ("k8s:io.cilium.k8s.policy.cluster", "default"),
        ("k8s:io.cilium.k8s.policy.serviceaccount", "default"),
        ("k8s:io.kubernetes.pod.namespace", ns),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if ns_name_label {
        m.insert(
            "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name".into(),
            ns.into(),
        );
    }
    m
}

/// A namespace with its `default` ServiceAccount (no controller-manager runs here to make it,
/// and the ServiceAccount admission plugin wants it) and pods that mount no token.
/// Cilium's ConfigMap as a cluster running it on its defaults has one: switch-prepare writes
/// nothing on settings it could only assume.
const CILIUM_CONFIG: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cilium-config, namespace: kube-system}\ndata: {cluster-name: default, identity-allocation-mode: crd}\n";

fn namespace_with_pods(ns: &str, pods: &[(&str, &str)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {ns}}}\n"
    );
    for (name, app) in pods {
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}, pod-template-hash: h{name}}}}}\nspec: {{automountServiceAccountToken: false, containers: [{{name: c, image: x}}]}}\n"
        ));
    }
    out
}

/// A CiliumEndpoint named as its pod, using `id`.
fn endpoint(ns: &str, name: &str, id: u32) -> String {
    format!(
        "apiVersion: cilium.io/v2\nkind: CiliumEndpoint\nmetadata: {{name: {name}, namespace: {ns}}}\nstatus: {{identity: {{id: {id}}}}}\n"
    )
}

/// What Cilium 1.18's operator did, read from its log.
#[derive(Debug, Default)]
pub struct ControllerRun {
    /// `namespace/pod` -> the id it was given.
    pub allocated: BTreeMap<String, u32>,
    /// Ids of objects it created.
    pub created: BTreeSet<u32>,
    /// Ids of objects whose labels it rewrote.
    pub updated: BTreeSet<u32>,
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split_whitespace().next()
}

impl ControllerRun {
    fn parse(log: &str) -> ControllerRun {
        let mut run = ControllerRun::default();
        for line in log.lines() {
            let id = || field(line, "ciliumIdentityName").and_then(|v| v.parse::<u32>().ok());
            if line.contains("msg=\"CID allocated for pod\"") {
                if let (Some(pod), Some(id)) = (field(line, "k8sPodName"), id()) {
                    run.allocated.insert(pod.to_string(), id);
                }
            } else if line.contains("msg=\"Creating CID\"") {
                run.created.extend(id());
            } else if line.contains("msg=\"Updating CID\"") {
                run.updated.extend(id());
            }
        }
        run
    }
}

/// Runs Cilium 1.18's operator identity controller until every pod of `pods` has its id
/// and its log has been quiet a while, then stops it; or why it cannot run.
pub async fn run_controller(
    cp: &ControlPlane,
    dir: &Path,
    pods: usize,
    flags: &[&str],
) -> Result<ControllerRun, String> {
    let opsim = cilium_bin("opsim-1.18")?;
    let log_path = dir.join("opsim.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(opsim)
        .arg("--k8s-kubeconfig-path")
        .arg(&cp.kubeconfig)
        .arg("--identity-management-mode=operator")
        .args(flags)
        .env("HOME", dir)
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut last_len = 0;
    let mut quiet_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.len() != last_len {
            last_len = text.len();
            quiet_since = Instant::now();
        }
        let run = ControllerRun::parse(&text);
        if run.allocated.len() >= pods && quiet_since.elapsed() > Duration::from_millis(1500) {
            let _ = child.kill().await;
            return Ok(run);
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the operator did not settle: {} of {pods} pods allocated\n{}",
            run.allocated.len(),
            text.lines().rev().take(30).collect::<Vec<_>>().join("\n")
        );
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the operator exited ({status}):\n{text}");
        }
    }
}

/// The cluster both tests start from: pods in two namespaces, identities migrated by
/// `apply` from a kvstore minted by agents of several ages, endpoints for two pods.
struct Scenario {
    cp: ControlPlane,
    etcd: Etcd,
    dir: tempfile::TempDir,
    /// Whether the server labels namespaces with their name (1.21+).
    labels_ns_name: bool,
    /// The kvstore's ids, all migrated.
    migrated: BTreeSet<u32>,
}

impl Scenario {
    /// Starts the server and builds the cluster, or says why `test` is skipped.
    async fn start(test: &str) -> Option<Scenario> {
        let cp = ControlPlane::start(test)?;
        if let Err(why) = cilium_bin("opsim-1.18") {
            skip(test, &why);
            return None;
        }
        cp.apply(CILIUM_CONFIG);
        // Servers since 1.21 label every namespace with its name; agents that ran there put
        // it in their identities, agents that ran on older servers did not.
        let labels_ns_name = !cp.version().starts_with("v1.19");
        cp.apply(&namespace_with_pods(
            "shop",
            &[
                ("web-1", "web"),
                ("web-2", "web"),
                ("api-1", "api"),
                ("new-1", "new"),
            ],
        ));
        cp.apply(&namespace_with_pods(
            "blog",
            &[("db-1", "db"), ("new-2", "new")],
        ));
        // In the host's network: the operator computes nothing for it.
        cp.apply(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: host-1, namespace: blog, labels: {app: host}}\nspec: {hostNetwork: true, automountServiceAccountToken: false, containers: [{name: c, image: x}]}\n",
        );
        // The kvstore, minted by agents: web exactly as 1.18 computes it; api before the
        // namespace's name label existed; db without the cluster label (an agent before 1.4).
        let etcd = Etcd::start().await;
        let web = operator_set("web", "shop", labels_ns_name);
        let api = operator_set("api", "shop", false);
        let mut db = operator_set("db", "blog", labels_ns_name);
        db.remove("k8s:io.cilium.k8s.policy.cluster");
        let mut kv: Vec<(u32, BTreeMap<String, String>)> =
            vec![(1000, web), (1001, api), (1002, db)];
        for i in 0..40 {
            kv.push((
                2000 + i,
                operator_set(&format!("old-{i}"), "shop", labels_ns_name),
            ));
        }
        for (id, labels) in &kv {
            etcd.put(&format!("{P}/id/{id}"), label_key(labels).as_bytes())
                .await;
        }
        let dir = tempfile::tempdir().unwrap();
        apply_everything(dir.path(), &cp.kubeconfig, &etcd, "migrate.jsonl").await;
        cp.apply(&format!(
            "{}---\n{}",
            endpoint("shop", "web-1", 1000),
            endpoint("shop", "api-1", 1001)
        ));
        Some(Scenario {
            cp,
            etcd,
            dir,
            labels_ns_name,
            migrated: kv.iter().map(|(id, _)| *id).collect(),
        })
    }

    async fn report(&self, args: &[&str]) -> crate::harness::Run {
        let args = [&["switch-report"], args].concat();
        cli_no_etcd(self.dir.path(), &self.cp.kubeconfig, &args, 120)
            .await
            .0
    }

    async fn run(&self, args: &[&str]) -> crate::harness::Run {
        cli(self.dir.path(), &self.cp.kubeconfig, &self.etcd, args, 120)
            .await
            .0
    }

    /// The CiliumEndpointSlice CRD posted (it is optional in the control plane) and served.
    fn serve_slices(&self) {
        self.cp.apply(SLICE_CRD);
        self.cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/ciliumendpointslices.cilium.io",
        ]);
    }

    /// The plan of `switch-prepare --remove-unused-after 0s` (nothing written), as JSON.
    async fn plan_removing_unused(&self) -> serde_json::Value {
        let args = [
            "switch-prepare",
            "--remove-unused-after",
            "0s",
            "--output",
            "json",
        ];
        let r = self.run(&args).await;
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        serde_json::from_str(&r.stdout).expect(&r.stdout)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn switch_report_says_what_cilium_1_18s_operator_then_does_to_each_pod() {
    let test = "real::switch::switch_report_says_what_cilium_1_18s_operator_then_does";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let (cp, d, labels_ns_name) = (&sc.cp, sc.dir.path(), sc.labels_ns_name);
    let r = sc.report(&["--output", "json"]).await;
    assert_eq!(r.code, 1, "not safe yet: {}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let outcome = |pod: &str| -> (String, Option<u64>) {
        let p = report["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pod"] == pod)
            .unwrap_or_else(|| panic!("{pod} not in the report"));
        (
            p["outcome"].as_str().unwrap().to_string(),
            p["id"].as_u64().or(p["nearest"].as_u64()),
        )
    };
    let api_outcome = if labels_ns_name {
        "re-minted"
    } else {
        "adopted"
    };
    assert_eq!(outcome("shop/web-1"), ("adopted".into(), Some(1000)));
    assert_eq!(outcome("shop/web-2"), ("adopted".into(), Some(1000)));
    assert_eq!(outcome("shop/api-1"), (api_outcome.into(), Some(1001)));
    assert_eq!(outcome("blog/db-1"), ("re-minted".into(), Some(1002)));
    assert_eq!(outcome("shop/new-1").0, "no-identity");
    assert_eq!(outcome("blog/host-1").0, "host-network");
    assert_eq!(outcome("blog/new-2").0, "no-identity");
    // The 40 old identities and db's: no pod adopts them and no endpoint uses them (api's
    // endpoint keeps 1001 in use even where its pod is re-minted).
    assert_eq!(report["counts"]["unused_identities"], 41);
    let ours = report["unused"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["run"].is_string())
        .count();
    assert_eq!(ours, 41, "apply made them all");

    // Cilium's own controller, then: each pod as the report said.
    let run = match run_controller(cp, d, 6, &[]).await {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    };
    let before = &sc.migrated;
    let objects = cp.identities();
    for p in report["pods"].as_array().unwrap() {
        let pod = p["pod"].as_str().unwrap();
        if p["outcome"] == "host-network" {
            assert!(!run.allocated.contains_key(pod), "{pod} was given an id");
            continue;
        }
        let got = run.allocated[pod];
        match p["outcome"].as_str().unwrap() {
            "adopted" => assert_eq!(u64::from(got), p["id"].as_u64().unwrap(), "{pod}"),
            "re-minted" | "no-identity" => {
                // A new id, or an unused one the draw landed on and rewrote.
                assert!(
                    !before.contains(&got) || run.updated.contains(&got),
                    "{pod} got {got}, an identity the report did not expect it to draw"
                );
                // The object now holds exactly the labels the report computed.
                let want: BTreeMap<String, String> =
                    serde_json::from_value(p["labels"].clone()).unwrap();
                assert_eq!(objects[&got.to_string()], want, "{pod}");
            }
            other => panic!("{pod}: {other}"),
        }
    }
    let drawn = report["counts"]["label_sets_drawn"].as_u64().unwrap();
    assert_eq!(
        (run.created.len() + run.updated.len()) as u64,
        drawn,
        "one object per label set drawn: {run:?}"
    );

    // Afterwards every pod holds an identity of its own labels: safe. Where api was
    // re-minted its endpoint still names 1001 (its agent moves it later): the report says so.
    let r = sc.report(&[]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("safe: every pod is adopted"),
        "{}",
        r.stdout
    );
    if labels_ns_name {
        let api_now = run.allocated["shop/api-1"];
        assert!(
            r.stdout.contains(&format!(
                "endpoint shop/api-1 uses 1001: the operator gives its pod {api_now}"
            )),
            "{}",
            r.stdout
        );
    } else {
        assert!(!r.stdout.contains("endpoint shop/"), "{}", r.stdout);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prepared_the_switch_draws_nothing_and_cilium_1_18s_operator_adopts_every_pod() {
    let test = "real::switch::prepared_the_switch_draws_nothing";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let (cp, d) = (&sc.cp, sc.dir.path());
    // A kvstore identity sync has not mirrored yet, and an endpoint whose pod is gone: the
    // ids a prepared identity must not take, beside every object's.
    sc.etcd
        .put(
            &format!("{P}/id/65535"),
            b"k8s:app=fresh;k8s:io.kubernetes.pod.namespace=shop;",
        )
        .await;
    cp.apply(&endpoint("shop", "gone-1", 65534));
    let before = cp.identities();

    // Without --yes: the plan, and nothing changed.
    let r = sc.run(&["switch-prepare", "--output", "json"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(cp.identities(), before, "nothing was changed");
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let creates = plan["plan"]["creates"].as_array().unwrap().clone();
    let drawn = plan["report"]["counts"]["label_sets_drawn"]
        .as_u64()
        .unwrap();
    assert_eq!(
        creates.len() as u64,
        drawn,
        "one identity per label set drawn"
    );
    for c in &creates {
        let id = c["id"].as_u64().unwrap();
        assert!(id < 65534, "{id}: held in the kvstore or by an endpoint");
    }

    // With --yes, then rollback of its log: exactly what it created goes.
    let log = d.join("prepare.jsonl").display().to_string();
    let prep = ["switch-prepare", "--decision-log", &log, "--yes"];
    let r = sc.run(&prep).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        cp.identities().len(),
        before.len() + creates.len(),
        "{}",
        r.stdout
    );
    let r = sc.run(&["rollback", "--decision-log", &log, "--yes"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        cp.identities(),
        before,
        "rollback removed exactly what it created"
    );

    // Prepared again: the report says safe, and Cilium's own controller draws nothing.
    let log = d.join("prepare-2.jsonl").display().to_string();
    let r = sc
        .run(&["switch-prepare", "--decision-log", &log, "--yes"])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = sc.report(&["--output", "json"]).await;
    assert_eq!(r.code, 0, "safe now: {}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let run = match run_controller(cp, d, 6, &[]).await {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    };
    assert!(
        run.created.is_empty(),
        "the controller created {:?}",
        run.created
    );
    assert!(
        run.updated.is_empty(),
        "the controller rewrote {:?}",
        run.updated
    );
    for p in report["pods"].as_array().unwrap() {
        let pod = p["pod"].as_str().unwrap();
        if pod == "blog/host-1" {
            assert_eq!(p["outcome"], "host-network");
            assert!(!run.allocated.contains_key(pod), "{pod} was given an id");
            continue;
        }
        assert_eq!(p["outcome"], "adopted", "{pod}");
        assert_eq!(
            u64::from(run.allocated[pod]),
            p["id"].as_u64().unwrap(),
            "{pod}"
        );
    }
    // Every pod whose endpoint names an identity of its own labels keeps it; api's endpoint
    // (1.36: labels of before 1.21) moves, as the report said it would.
    assert_eq!(run.allocated["shop/web-1"], 1000);
    let api_keeps = !sc.labels_ns_name;
    assert_eq!(run.allocated["shop/api-1"] == 1001, api_keeps);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_report_reads_cilium_config_as_cilium_1_18s_operator_does() {
    let test = "real::switch::the_report_reads_cilium_config";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let (cp, d) = (&sc.cp, sc.dir.path());
    // A cluster named east whose operator keeps only `app` of the pods' own labels: an allow
    // list, so the service account goes too; every migrated identity says cluster default.
    cp.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cilium-config, namespace: kube-system}\ndata: {labels: 'k8s:app', cluster-name: east, identity-management-mode: agent}\n",
    );
    let r = sc.report(&["--output", "json"]).await;
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    assert_eq!(report["settings"]["cluster_name"], "east");
    assert_eq!(report["settings"]["labels"][0], "k8s:app");
    assert_eq!(report["counts"]["adopted"], 0, "{}", r.stdout);
    let web = report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == "shop/web-1")
        .unwrap();
    assert_eq!(web["nearest"], 1000);
    assert!(
        web["lacks"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("k8s:io.cilium.k8s.policy.cluster=east")),
        "{web}"
    );
    let flags = ["--opsim-labels", "k8s:app", "--opsim-cluster-name", "east"];
    let run = match run_controller(cp, d, 6, &flags).await {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    };
    // Every pod drew, and the object it got holds exactly the labels the report computed.
    let objects = cp.identities();
    for p in report["pods"].as_array().unwrap() {
        let pod = p["pod"].as_str().unwrap();
        let Some(&got) = run.allocated.get(pod) else {
            assert_eq!(p["outcome"], "host-network", "{pod} was given no id");
            continue;
        };
        assert!(
            !sc.migrated.contains(&got) || run.updated.contains(&got),
            "{pod}: {got}"
        );
        let want: BTreeMap<String, String> = serde_json::from_value(p["labels"].clone()).unwrap();
        assert!(
            !want.contains_key("k8s:io.cilium.k8s.policy.serviceaccount"),
            "{want:?}"
        );
        assert_eq!(objects[&got.to_string()], want, "{pod}");
    }
}

/// A cluster of `exact` pods whose identity was migrated exactly, `new` pods with none and
/// `unused` identities no pod uses, all migrated by `apply` from the kvstore.
async fn bulk_cluster(test: &str, exact: u32, new: u32, unused: u32) -> Option<Scenario> {
    let cp = ControlPlane::start(test)?;
    if let Err(why) = cilium_bin("opsim-1.18") {
        skip(test, &why);
        return None;
    }
    cp.apply(CILIUM_CONFIG);
    let labels_ns_name = !cp.version().starts_with("v1.19");
    let pods: Vec<(String, String)> = (0..exact)
        .map(|i| (format!("exact-{i}"), format!("exact-{i}")))
        .chain((0..new).map(|i| (format!("new-{i}"), format!("new-{i}"))))
        .collect();
    let pods: Vec<(&str, &str)> = pods.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
    let out = cp.kubectl_as(
        &cp.kubeconfig,
        &["create", "-f", "-"],
        Some(&namespace_with_pods("bulk", &pods)),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let etcd = Etcd::start().await;
    let mut migrated = BTreeSet::new();
    for i in 0..exact + unused {
        let id = 1000 + i;
        let app = if i < exact {
            format!("exact-{i}")
        } else {
            format!("old-{i}")
        };
        let labels = operator_set(&app, "bulk", labels_ns_name);
        etcd.put(&format!("{P}/id/{id}"), label_key(&labels).as_bytes())
            .await;
        migrated.insert(id);
    }
    let dir = tempfile::tempdir().unwrap();
    apply_everything(dir.path(), &cp.kubeconfig, &etcd, "migrate.jsonl").await;
    Some(Scenario {
        cp,
        etcd,
        dir,
        labels_ns_name,
        migrated,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn unprepared_the_switch_rewrites_identities_at_random_and_prepared_it_rewrites_none() {
    let test = "real::switch::unprepared_the_switch_rewrites_identities";
    let (exact, new, unused) = (200, 400, 2000);
    // Unprepared: 400 draws over 2,200 identities no pod has claimed yet: about 13 land on
    // one and rewrite it (none in e^-13 runs).
    let Some(sc) = bulk_cluster(test, exact, new, unused).await else {
        return;
    };
    let r = sc.report(&["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    assert_eq!(report["counts"]["label_sets_drawn"], new);
    let expected = report["counts"]["expected_unused_rewritten"]
        .as_f64()
        .unwrap();
    assert!((11.0..13.0).contains(&expected), "{expected}");
    let pods = (exact + new) as usize;
    let run = match run_controller(&sc.cp, sc.dir.path(), pods, &[]).await {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    };
    assert!(
        !run.updated.is_empty(),
        "the controller rewrote no identity: {} created",
        run.created.len()
    );
    assert!(run.updated.iter().all(|id| sc.migrated.contains(id)));
    drop(sc);

    // Prepared, on a cluster built the same way: nothing drawn, nothing rewritten.
    let Some(sc) = bulk_cluster(test, exact, new, unused).await else {
        return;
    };
    let log = sc.dir.path().join("prepare.jsonl").display().to_string();
    let r = sc
        .run(&["switch-prepare", "--decision-log", &log, "--yes"])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = sc.report(&[]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let run = match run_controller(&sc.cp, sc.dir.path(), pods, &[]).await {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    };
    assert!(run.created.is_empty(), "created {:?}", run.created);
    assert!(run.updated.is_empty(), "rewrote {:?}", run.updated);
    for i in 0..exact {
        assert_eq!(run.allocated[&format!("bulk/exact-{i}")], 1000 + i);
    }
}

/// The CiliumEndpointSlice CRD as Cilium installs it, its schema left open.
const SLICE_CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"ciliumendpointslices.cilium.io"},"spec":{"group":"cilium.io","names":{"kind":"CiliumEndpointSlice","plural":"ciliumendpointslices","singular":"ciliumendpointslice","shortNames":["ces"]},"scope":"Cluster","versions":[{"name":"v2alpha1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#;

#[tokio::test(flavor = "multi_thread")]
async fn endpoints_in_slices_count_and_with_no_endpoint_known_nothing_is_removed() {
    let test = "real::switch::endpoints_in_slices_count";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let cp = &sc.cp;
    // Endpoints kept in slices (enable-cilium-endpoint-slice): web-2's names 1000.
    sc.serve_slices();
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumEndpointSlice\nmetadata: {name: ces-1}\nnamespace: shop\nendpoints: [{name: web-2, id: 1000}]\n",
    );
    let r = sc.report(&["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let web2 = report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == "shop/web-2")
        .unwrap();
    assert_eq!(web2["endpoint_id"], 1000, "{web2}");

    // No kind of endpoint served: nothing is known to be unused, and nothing is removed.
    cp.kubectl(&["delete", "crd", "ciliumendpointslices.cilium.io"]);
    cp.kubectl(&["delete", "crd", "ciliumendpoints.cilium.io"]);
    let prep = sc.plan_removing_unused().await;
    assert_eq!(prep["plan"]["removals"], serde_json::json!([]), "{prep}");
    let known = prep["report"]["settings"]["cannot_know"].to_string();
    assert!(known.contains("no endpoint is known"), "{known}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_switch_role_is_all_a_user_bound_by_rbac_needs() {
    let test = "real::switch::the_switch_role_is_all";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let cp = &sc.cp;
    let user = cp.kubeconfig_user.clone();
    let run_as_user = |args: Vec<String>| {
        let (dir, user) = (sc.dir.path().to_path_buf(), user.clone());
        let etcd = sc.etcd.endpoint.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let flags = ["--etcd-endpoints", etcd.as_str()];
            let etcd_flags: &[&str] = if args[0] == "switch-prepare" {
                &flags
            } else {
                &[]
            };
            super::run_bin(&dir, &user, &args, etcd_flags, 120).await.0
        }
    };
    // Without the role: refused, and said so.
    let r = run_as_user(vec!["switch-report".into()]).await;
    assert_eq!(r.code, 2, "a refusal is configuration: {}", r.stderr);
    assert!(r.stderr.contains("forbidden"), "{}", r.stderr);
    let role = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/clusterrole-switch.yaml"),
    )
    .unwrap();
    cp.apply(&role);
    cp.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: cilium-idmig-switch}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cilium-idmig-switch}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: limited-user}]\n",
    );
    let r = run_as_user(vec!["switch-report".into()]).await;
    assert_eq!(r.code, 1, "not safe yet: {}{}", r.stdout, r.stderr);
    let log = sc.dir.path().join("user.jsonl").display().to_string();
    let prepare = ["switch-prepare", "--decision-log", &log, "--yes"];
    let r = run_as_user(prepare.iter().map(|s| s.to_string()).collect()).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = run_as_user(vec!["switch-report".into()]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_after_switch_prepare_says_what_it_removed_as_removed_not_missing() {
    let test = "real::switch::verify_after_switch_prepare_says_what_it_removed";
    let Some(sc) = Scenario::start(test).await else {
        return;
    };
    let d = sc.dir.path();
    let log = d.join("prepare.jsonl").display().to_string();
    let r = sc
        .run(&[
            "switch-prepare",
            "--remove-unused-after",
            "0s",
            "--decision-log",
            &log,
            "--yes",
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let migrate = d.join("migrate.jsonl").display().to_string();
    let r = sc.run(&["verify", "--decision-log", &migrate, &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // The identities no endpoint used (old-0 .. old-39, db's) were removed, each said so.
    let removed = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("removed "))
        .count();
    assert!(removed > 40, "{}", r.stdout);
    assert!(
        r.stdout
            .contains(&format!("{removed} removed by switch-prepare, 0 problems")),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("removed     id 2000 by switch-prepare"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("missing"), "{}", r.stdout);
}

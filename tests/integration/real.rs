//! The same scenarios on a real kube-apiserver (v1.19, with RBAC) beside a real etcd: apply,
//! verify and rollback as a new user runs them, a rollback where the CiliumEndpoint CRD is
//! not served, and sync with credentials RBAC refuses. Each test is skipped, saying why,
//! where no real server is configured (`tests/support/control_plane.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{Etcd, Run, bin};
use crate::support::control_plane::ControlPlane;

mod fleet;
mod switch;

const P: &str = "cilium/state/identities/v1";
const A: &str = "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;";
const B: &str = "k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;";
const C: &str = "k8s:app=c;k8s:io.kubernetes.pod.namespace=shop;";

/// The binary with this kubeconfig and etcd, killed if it outlives `secs`.
async fn cli(dir: &Path, kc: &Path, etcd: &Etcd, args: &[&str], secs: u64) -> (Run, Duration) {
    // Rollback reads no kvstore, and takes no etcd flag.
    let etcd_flags = match args.first() {
        Some(&"rollback") => vec![],
        _ => vec!["--etcd-endpoints", &etcd.endpoint],
    };
    run_bin(dir, kc, args, &etcd_flags, secs).await
}

/// The binary with this kubeconfig and no etcd at all.
async fn cli_no_etcd(dir: &Path, kc: &Path, args: &[&str], secs: u64) -> (Run, Duration) {
    run_bin(dir, kc, args, &[], secs).await
}

async fn run_bin(
    dir: &Path,
    kc: &Path,
    args: &[&str],
    extra: &[&str],
    secs: u64,
) -> (Run, Duration) {
    let start = Instant::now();
    let child = tokio::process::Command::new(bin())
        .current_dir(dir)
        .args(args)
        .arg("--kubeconfig")
        .arg(kc)
        .args(extra)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(secs), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} still running after {secs} s"))
        .unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (run, start.elapsed())
}

/// `apply --yes` of everything in the kvstore, which must succeed; the decision log's path.
async fn apply_everything(dir: &Path, kc: &Path, etcd: &Etcd, log: &str) -> String {
    let log = dir.join(log).display().to_string();
    let args = ["apply", "--yes", "--decision-log", &log];
    let (r, _) = cli(dir, kc, etcd, &args, 120).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    log
}

fn security_labels(key: &str) -> BTreeMap<String, String> {
    let parsed = cilium_idmig::core::labels::parse_label_key(key).unwrap();
    cilium_idmig::core::labels::to_security_labels(&parsed)
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_verify_and_rollback_on_a_real_server_and_without_the_endpoint_crd() {
    let Some(cp) = ControlPlane::start("real::apply_verify_and_rollback") else {
        return;
    };
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    etcd.put(&format!("{P}/id/301"), B.as_bytes()).await;
    etcd.put(&format!("{P}/id/302"), C.as_bytes()).await;
    // 302 is already there, created by a CRD-mode agent: never this tool's to delete.
    cp.create_identity(302, &security_labels(C));
    let dir = tempfile::tempdir().unwrap();
    let (d, kc) = (dir.path(), cp.kubeconfig.as_path());
    let log = apply_everything(d, kc, &etcd, "apply.jsonl").await;
    let objects = cp.identities();
    assert_eq!(
        objects.keys().collect::<Vec<_>>(),
        ["300", "301", "302"],
        "{objects:?}"
    );
    assert_eq!(objects["300"], security_labels(A));
    assert_eq!(objects["301"], security_labels(B));
    let (r, _) = cli(d, kc, &etcd, &["verify", "--decision-log", &log], 120).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);

    // Without the CiliumEndpoint CRD, rollback cannot tell what is in use: it says so and
    // what to do, and deletes nothing.
    cp.kubectl(&["delete", "crd", "ciliumendpoints.cilium.io"]);
    let rollback = ["rollback", "--decision-log", &log, "--yes"];
    let (r, _) = cli(d, kc, &etcd, &rollback, 120).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("does not serve ciliumendpoints.cilium.io")
            && r.stderr.contains("--include-in-use"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("404 page not found"), "{}", r.stderr);
    assert_eq!(cp.identities().len(), 3);

    // With --include-in-use: exactly what the run created goes.
    let rollback = [&rollback[..], &["--include-in-use"]].concat();
    let (r, _) = cli(d, kc, &etcd, &rollback, 120).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        cp.identities().keys().collect::<Vec<_>>(),
        ["302"],
        "{}",
        r.stdout
    );
}

/// The Lease Role of `assets/clusterrole.yaml`, and nothing else, bound to `limited-user`.
const LEASE_ONLY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: cilium-idmig-sync-lease
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: cilium-idmig-sync-lease
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: limited-user
"#;

/// The test's user may hold sync's Lease (the Lease Role of `assets/clusterrole.yaml`,
/// bound to it) and nothing else yet.
fn grant_the_lease_only(cp: &ControlPlane) {
    let role = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/clusterrole.yaml"
    ))
    .unwrap();
    cp.apply(role.split("\n---\n").nth(1).expect("the Lease Role"));
    cp.apply(LEASE_ONLY);
}

/// Who holds sync's Lease now (empty: nobody).
fn lease_holder(cp: &ControlPlane) -> String {
    let holder = cp.kubectl(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "cilium-idmig-sync",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    holder.trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_that_rbac_refuses_ends_with_exit_2_and_gives_its_lease_up() {
    let Some(cp) = ControlPlane::start("real::sync_that_rbac_refuses") else {
        return;
    };
    grant_the_lease_only(&cp);
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["sync", "--until-cutover", "--cutover-grace", "2s"];
    let (r, took) = cli(dir.path(), &cp.kubeconfig_user, &etcd, &args, 90).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(took < Duration::from_secs(30), "{took:?}");
    for what in ["refused", "ciliumidentities", "grant", "clusterrole.yaml"] {
        assert!(r.stderr.contains(what), "{what}: {}", r.stderr);
    }
    // It took the Lease (that much it may) and gave it up before it ended.
    assert_eq!(lease_holder(&cp), "", "the Lease is still held");
    assert!(cp.identities().is_empty());
}

/// sync's ClusterRole with `create` on ciliumidentities taken away (a trimmed role), bound
/// to the test's user, with the Lease Role.
const NO_CREATE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: cilium-idmig-no-create
rules:
  - apiGroups: ["cilium.io"]
    resources: ["ciliumidentities"]
    verbs: ["list", "get", "watch"]
  - apiGroups: ["apiextensions.k8s.io"]
    resources: ["customresourcedefinitions"]
    verbs: ["get"]
  - apiGroups: ["authorization.k8s.io"]
    resources: ["selfsubjectaccessreviews"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: cilium-idmig-no-create
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cilium-idmig-no-create
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: limited-user
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_create_rbac_refuses_ends_sync_and_apply_with_exit_2_in_the_servers_words() {
    let Some(cp) = ControlPlane::start("real::a_create_rbac_refuses") else {
        return;
    };
    grant_the_lease_only(&cp);
    for doc in NO_CREATE.split("\n---\n") {
        cp.apply(doc);
    }
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Sync starts with nothing to write (what it may do, it does), then an identity arrives
    // in the kvstore: its create is refused, and sync ends within the round.
    let sync = {
        let (dir, kc, etcd_endpoint) = (
            dir.path().to_path_buf(),
            cp.kubeconfig_user.clone(),
            etcd.endpoint.clone(),
        );
        tokio::spawn(async move {
            let args = ["sync", "--until-cutover", "--cutover-grace", "2s"];
            run_bin(&dir, &kc, &args, &["--etcd-endpoints", &etcd_endpoint], 120).await
        })
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    let arrived = Instant::now();
    let (r, _) = sync.await.unwrap();
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        arrived.elapsed() < Duration::from_secs(30),
        "{:?} after the identity arrived",
        arrived.elapsed()
    );
    for what in [
        "refused",
        "forbidden",
        "create",
        "grant",
        "clusterrole.yaml",
    ] {
        assert!(r.stderr.contains(what), "{what}: {}", r.stderr);
    }
    assert_eq!(lease_holder(&cp), "", "the Lease is still held");
    // apply with the same credentials: exit 2, the server's words, nothing written.
    let (r, _) = cli(
        dir.path(),
        &cp.kubeconfig_user,
        &etcd,
        &["apply", "--yes"],
        90,
    )
    .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    let said = format!("{}{}", r.stdout, r.stderr);
    for what in ["forbidden", "create", "clusterrole.yaml"] {
        assert!(said.contains(what), "{what}: {said}");
    }
    assert!(cp.identities().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_on_a_real_server_finds_what_the_sandbox_finds() {
    use crate::audit::{B, C, G, X, Y, check_findings, seed_kvstore};
    let Some(cp) = ControlPlane::start("real::audit") else {
        return;
    };
    let etcd = Etcd::start().await;
    seed_kvstore(&etcd).await;
    for (id, l) in [(300, X), (401, B), (302, C), (500, Y)] {
        cp.create_identity(id, &security_labels(l));
    }
    let mut marked = cilium_idmig::core::identity::identity_object(
        310,
        &cilium_idmig::core::labels::to_security_labels(
            &cilium_idmig::core::labels::parse_label_key(G).unwrap(),
        ),
    );
    marked["metadata"]["annotations"] =
        serde_json::json!({"io.cilium.heartbeat": "2026-12-01T00:00:00Z"});
    cp.apply(&marked.to_string());
    cp.kubectl(&["create", "namespace", "shop"]);
    cp.apply(
        &serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumEndpoint",
            "metadata": {"name": "cart-1", "namespace": "shop"},
            "status": {"identity": {"id": 401, "labels": []}, "state": "ready"},
        })
        .to_string(),
    );
    let before = cp.identities();
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = cli(
        dir.path(),
        &cp.kubeconfig,
        &etcd,
        &["audit", "--output", "json"],
        60,
    )
    .await;
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let json: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    check_findings(&json);
    assert_eq!(cp.identities(), before, "nothing written");
}

/// One allocation as Cilium's allocator harness prints it.
#[derive(serde::Deserialize, Debug)]
struct Allocation {
    labels: String,
    id: u64,
    new: bool,
    err: String,
}

/// Runs Cilium 1.18's own allocator as one node in `mode`, allocating every label set of
/// `workload` once; what it allocated.
fn allocate_as_cilium_1_18(
    bin: &Path,
    mode: &str,
    cp: &ControlPlane,
    etcd: &Etcd,
    workload: &[&str],
    dir: &Path,
) -> Vec<Allocation> {
    let wl = dir.join(format!("workload-{mode}.txt"));
    std::fs::write(&wl, workload.join("\n") + "\n").unwrap();
    let home = dir.join(format!("home-{mode}"));
    std::fs::create_dir_all(&home).unwrap();
    let out = std::process::Command::new(bin)
        .args([
            "-mode",
            mode,
            "-node",
            "10.0.0.9",
            "-rate",
            "0",
            "-duration",
            "4s",
        ])
        .args(["-min", "256", "-max", "700"])
        .arg("-workload")
        .arg(&wl)
        .arg("-kubeconfig")
        .arg(&cp.kubeconfig)
        .arg("-etcd-config")
        .arg(etcd.config_file())
        .env("K8S_NODE_NAME", "node-a")
        .env("HOME", &home)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let allocations: Vec<Allocation> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        allocations.len(),
        workload.len(),
        "{mode}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    allocations
}

#[tokio::test(flavor = "multi_thread")]
async fn cilium_1_18s_own_allocator_finds_every_identity_apply_wrote() {
    let bin = match crate::support::control_plane::cilium_bin("allocsim-1.18") {
        Ok(b) => b,
        Err(why) => return crate::support::control_plane::skip("real::cilium_1_18", &why),
    };
    let Some(cp) = ControlPlane::start("real::cilium_1_18") else {
        return;
    };
    let long = "v".repeat(70);
    let odd = format!("k8s:app=odd;k8s:build={long};k8s:io.kubernetes.pod.namespace=shop;");
    let sets: Vec<String> = (0..10)
        .map(|i| {
            format!(
                "k8s:app=svc{i};k8s:io.cilium.k8s.namespace.labels.team=t{i};k8s:io.kubernetes.pod.namespace=shop;"
            )
        })
        .chain([odd.clone()])
        .collect();
    let etcd = Etcd::start().await;
    let mut expected = BTreeMap::new();
    for (i, l) in sets.iter().enumerate() {
        let id = 300 + i as u64;
        etcd.put(&format!("{P}/id/{id}"), l.as_bytes()).await;
        expected.insert(l.clone(), id);
    }
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = cli(dir.path(), &cp.kubeconfig, &etcd, &["apply", "--yes"], 120).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let before = cp.identities();
    assert_eq!(before.len(), sets.len());
    // What 1.18's CRD backend would write: metadata.labels without the namespace's labels;
    // the label the API server would refuse left out and said, security-labels exact.
    let obj: serde_json::Value =
        serde_json::from_str(&cp.kubectl(&["get", "ciliumidentity", "300", "-o", "json"])).unwrap();
    assert_eq!(
        obj["metadata"]["labels"],
        serde_json::json!({"app": "svc0", "io.kubernetes.pod.namespace": "shop"})
    );
    let odd_id = expected[&odd].to_string();
    let odd_obj: serde_json::Value =
        serde_json::from_str(&cp.kubectl(&["get", "ciliumidentity", &odd_id, "-o", "json"]))
            .unwrap();
    assert_eq!(
        odd_obj["metadata"]["annotations"]["cilium-idmig.io/labels-left-out"],
        "build"
    );
    assert_eq!(odd_obj["security-labels"]["k8s:build"], long.as_str());
    cp.apply(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}}"#);

    // Agents in crd and doublewrite-readcrd mode allocating every migrated label set get
    // exactly the ids written, and create nothing.
    let workload: Vec<&str> = sets.iter().map(String::as_str).collect();
    for mode in ["crd", "doublewrite-readcrd"] {
        let got = allocate_as_cilium_1_18(&bin, mode, &cp, &etcd, &workload, dir.path());
        for a in &got {
            assert_eq!(a.err, "", "{mode}: {a:?}");
            assert_eq!(Some(&a.id), expected.get(&a.labels), "{mode}: {a:?}");
            assert!(!a.new, "{mode} allocated a new identity: {a:?}");
        }
        assert_eq!(
            cp.identities(),
            before,
            "{mode} created or changed an object"
        );
    }
}

/// One step of the parity script: what kubectl said (exit, and the part of the answer the
/// tool reads), normalized where servers legitimately differ (uids, versions, timestamps).
fn parity_script(kubectl: &dyn Fn(&[&str], Option<&str>) -> std::process::Output) -> Vec<String> {
    let obj = |id: u32, app: &str| {
        serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumIdentity",
            "metadata": {"name": id.to_string(), "labels": {"app": app}},
            "security-labels": {"k8s:app": app},
        })
        .to_string()
    };
    let says = |o: std::process::Output| {
        format!(
            "exit {} {}",
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(if o.status.success() {
                &o.stdout
            } else {
                &o.stderr
            })
            .trim()
        )
    };
    let json = |o: std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
    };
    let mut out = Vec::new();
    // kubectl validates what it sends: the real 1.19 server from its OpenAPI v2, the
    // sandbox (as a 1.27+ server) by `fieldValidation=Strict` from its OpenAPI v3.
    for (id, app) in [(300, "a"), (301, "b"), (302, "b")] {
        let o = kubectl(&["create", "-f", "-"], Some(&obj(id, app)));
        out.push(format!("create {id}: {}", says(o)));
    }
    // A second create of a name: 409 AlreadyExists, never an overwrite.
    let o = kubectl(&["create", "-f", "-"], Some(&obj(300, "z")));
    out.push(format!("create 300 again: {}", says(o)));
    // An unknown field, with validation left to the server: dropped (the CRD's schema
    // prunes it), the object made. (With validation on, kubectl 1.32 lets 1.19 prune it too,
    // while a 1.27+ server, as the sandbox says it is, refuses it: tested on the sandbox.)
    let mut extra: serde_json::Value = serde_json::from_str(&obj(303, "c")).unwrap_or_default();
    extra["extra"] = serde_json::json!(1);
    let o = kubectl(
        &["create", "--validate=false", "-f", "-"],
        Some(&extra.to_string()),
    );
    let stored = json(kubectl(
        &["get", "ciliumidentity", "303", "-o", "json"],
        None,
    ));
    out.push(format!(
        "create with an unknown field: exit {}, kept {}",
        o.status.code().unwrap_or(-1),
        stored.get("extra").is_some()
    ));
    let o = kubectl(
        &[
            "get",
            "crd",
            "ciliumidentities.cilium.io",
            "-o",
            "jsonpath={.spec.names.kind} {.spec.scope} {.status.conditions[?(@.type==\"Established\")].status}",
        ],
        None,
    );
    out.push(format!("the CRD: {}", says(o)));
    let o = kubectl(
        &["api-resources", "--api-group=cilium.io", "-o", "name"],
        None,
    );
    out.push(format!("discovery: {}", says(o)));
    // The watch below replays what happens from here on.
    let listed = json(kubectl(
        &["get", "--raw", "/apis/cilium.io/v2/ciliumidentities"],
        None,
    ));
    let from = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let o = kubectl(&["get", "ciliumidentity", "9999"], None);
    out.push(format!("get missing: {}", says(o)));
    let o = kubectl(
        &["get", "ciliumidentities", "-l", "app=b", "-o", "name"],
        None,
    );
    out.push(format!("select app=b: {}", says(o)));
    // Paged: a continue token while more remain, none on the last page.
    let page = json(kubectl(
        &[
            "get",
            "--raw",
            "/apis/cilium.io/v2/ciliumidentities?limit=2",
        ],
        None,
    ));
    let cont = page["metadata"]["continue"]
        .as_str()
        .unwrap_or("")
        .to_string();
    out.push(format!(
        "page 1: {} items, continue {}",
        page["items"].as_array().map_or(0, Vec::len),
        !cont.is_empty()
    ));
    let page = json(kubectl(
        &[
            "get",
            "--raw",
            &format!(
                "/apis/cilium.io/v2/ciliumidentities?limit=2&continue={}",
                cilium_idmig::io::k8s::urlencode(&cont)
            ),
        ],
        None,
    ));
    out.push(format!(
        "page 2: {} items, continue {:?}, remaining {:?}",
        page["items"].as_array().map_or(0, Vec::len),
        page["metadata"]["continue"].as_str().unwrap_or(""),
        page["metadata"]["remainingItemCount"]
    ));
    // From the watch cache: everything, unpaged.
    let all = json(kubectl(
        &[
            "get",
            "--raw",
            "/apis/cilium.io/v2/ciliumidentities?resourceVersion=0",
        ],
        None,
    ));
    out.push(format!(
        "cache list: {} items",
        all["items"].as_array().map_or(0, Vec::len)
    ));
    // The order of a cache list is not specified (a real watch cache need not sort by name;
    // the sandbox does): the tool reads lists into maps, so only the object itself counts.
    let item = all["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["metadata"]["name"] == "300"))
        .cloned()
        .unwrap_or_default();
    out.push(format!(
        "item: kind {} apiVersion {} name {} labels {} uid {}",
        item["kind"],
        item["apiVersion"],
        item["metadata"]["name"],
        item["security-labels"],
        item["metadata"]["uid"].is_string()
    ));
    let o = kubectl(&["get", "lease", "-n", "kube-system", "nope"], None);
    out.push(format!("lease missing: {}", says(o)));
    // Writes by hand: labels, annotations, merge and JSON patches, and what is refused.
    for args in [
        &["label", "ciliumidentity", "301", "team=x"][..],
        &["annotate", "ciliumidentity", "301", "note=hi"],
        &[
            "patch",
            "ciliumidentity",
            "301",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/security-labels/k8s:app","value":"c"}]"#,
        ],
        &[
            "patch",
            "ciliumidentity",
            "301",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/security-labels/k8s:app","value":"zzz"}]"#,
        ],
        &[
            "patch",
            "ciliumidentity",
            "301",
            "--type=merge",
            "-p",
            r#"{"security-labels":{"k8s:app":5}}"#,
        ],
        &[
            "patch",
            "ciliumidentity",
            "301",
            "--type=merge",
            "-p",
            r#"{"metadata":{"resourceVersion":"1"}}"#,
        ],
        &[
            "patch",
            "ciliumidentity",
            "301",
            "--type=merge",
            "-p",
            r#"{"metadata":{"name":"399"}}"#,
        ],
        &[
            "patch",
            "ciliumidentity",
            "301",
            "--type=strategic",
            "-p",
            r#"{"metadata":{"labels":{"a":"b"}}}"#,
        ],
        &[
            "patch",
            "ciliumidentity",
            "9999",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"a":"b"}}}"#,
        ],
        &["label", "ciliumidentity", "300", "app-"],
    ] {
        out.push(format!(
            "{}: {}",
            args[..3].join(" "),
            says(kubectl(args, None))
        ));
    }
    let o = kubectl(
        &["get", "ciliumidentities", "-l", "team=x", "-o", "name"],
        None,
    );
    out.push(format!("select team=x: {}", says(o)));
    let patched = json(kubectl(
        &["get", "ciliumidentity", "301", "-o", "json"],
        None,
    ));
    out.push(format!(
        "patched: generation {} labels {} annotations {} security-labels {}",
        patched["metadata"]["generation"],
        patched["metadata"]["labels"],
        patched["metadata"]["annotations"],
        patched["security-labels"]
    ));
    // The watch from before the writes replays each of them, in order, then ends at its
    // timeout.
    let events = kubectl(
        &[
            "get",
            "--raw",
            &format!(
                "/apis/cilium.io/v2/ciliumidentities?watch=1&resourceVersion={from}&timeoutSeconds=2&allowWatchBookmarks=true"
            ),
        ],
        None,
    );
    let replayed: Vec<String> = serde_json::Deserializer::from_slice(&events.stdout)
        .into_iter::<serde_json::Value>()
        .filter_map(Result::ok)
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|e| {
            format!(
                "{} {} {}",
                e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["labels"]
            )
        })
        .collect();
    out.push(format!(
        "watch from before the writes: exit {} {replayed:?}",
        events.status.code().unwrap_or(-1)
    ));
    // A watch from a resourceVersion long gone: one ERROR event, 410 Expired.
    let gone = json(kubectl(
        &[
            "get",
            "--raw",
            "/apis/cilium.io/v2/ciliumidentities?watch=1&resourceVersion=1&timeoutSeconds=2",
        ],
        None,
    ));
    out.push(format!(
        "watch from a compacted version: {} {} {}",
        gone["type"], gone["object"]["code"], gone["object"]["reason"]
    ));
    // Deletes with preconditions that no longer hold: 409, the object stays.
    for (what, options) in [
        ("uid", r#"{"preconditions":{"uid":"not-its-uid"}}"#),
        (
            "resourceVersion",
            r#"{"preconditions":{"resourceVersion":"1"}}"#,
        ),
    ] {
        let o = kubectl(
            &[
                "delete",
                "--raw",
                "/apis/cilium.io/v2/ciliumidentities/300",
                "-f",
                "-",
            ],
            Some(options),
        );
        let text = String::from_utf8_lossy(&o.stderr).into_owned();
        // The record's own uid and version differ between servers; the rest must not.
        let said = text
            .split(" in record (")
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        out.push(format!(
            "delete 300 if {what}: exit {} {said}",
            o.status.code().unwrap_or(-1)
        ));
    }
    // Where the releases differ: the version, and a streaming list (1.36 serves one; 1.19
    // refuses it).
    let version = json(kubectl(&["version", "-o", "json"], None));
    out.push(format!(
        "server minor: {}",
        version["serverVersion"]["minor"].as_str().unwrap_or("?")
    ));
    let o = kubectl(
        &[
            "get",
            "--raw",
            "/apis/cilium.io/v2/ciliumidentities?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2",
        ],
        None,
    );
    let streamed = if o.status.success() {
        let events: Vec<serde_json::Value> = o
            .stdout
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let added = events.iter().filter(|e| e["type"] == "ADDED").count();
        let ended = events.iter().any(|e| {
            e["type"] == "BOOKMARK"
                && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
        });
        format!("{added} added, initial events ended {ended}")
    } else {
        says(o)
    };
    out.push(format!("streaming list: {streamed}"));
    let o = kubectl(&["delete", "ciliumidentity", "302"], None);
    out.push(format!("delete 302: {}", says(o)));
    let o = kubectl(&["delete", "ciliumidentity", "302"], None);
    out.push(format!("delete 302 again: {}", says(o)));
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sandbox_answers_the_parity_script_as_the_real_server_does() {
    let Some(cp) = ControlPlane::start("real::parity") else {
        return;
    };
    // The sandbox answers as the release the real server is, where the two differ.
    let release = cilium_idmig::sandbox::Release::of_version(&cp.version())
        .unwrap_or_else(|| panic!("a release the sandbox does not model: {}", cp.version()));
    let sb = cilium_idmig::sandbox::Sandbox::start(
        cilium_idmig::sandbox::SandboxConfig::answering_as(release),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sb_kc = dir.path().join("kubeconfig");
    sb.write_kubeconfig(&sb_kc).unwrap();
    let real = parity_script(&|args, stdin| cp.kubectl_as(&cp.kubeconfig, args, stdin));
    let sandbox = tokio::task::block_in_place(|| {
        parity_script(&|args, stdin| cp.kubectl_as(&sb_kc, args, stdin))
    });
    let differ: Vec<String> = real
        .iter()
        .zip(&sandbox)
        .filter(|(r, s)| r != s)
        .map(|(r, s)| format!("real:    {r}\nsandbox: {s}"))
        .collect();
    assert!(
        differ.is_empty(),
        "the sandbox differs:\n{}",
        differ.join("\n\n")
    );
}

/// The rollout `way` played with Cilium 1.18's allocator on a real stack, or `None` (said)
/// where the allocator or the real server is not there.
async fn rollout(
    way: crate::support::cilium_rollout::Way,
    test: &str,
) -> Option<crate::support::cilium_rollout::Played> {
    let allocsim = match crate::support::control_plane::cilium_bin("allocsim-1.18") {
        Ok(b) => b,
        Err(why) => {
            crate::support::control_plane::skip(test, &why);
            return None;
        }
    };
    let cp = ControlPlane::start(test)?;
    let etcd = Etcd::start().await;
    Some(
        crate::support::cilium_rollout::play(
            way,
            crate::support::cilium_rollout::Pace::BackToBack,
            &allocsim,
            bin(),
            &cp,
            &etcd,
        )
        .await,
    )
}

/// Cilium 1.18's documented double-write rollout, played by its own allocator: the stores end
/// up disagreeing (F6 of the reference), and `audit` counts exactly what both stores hold.
#[tokio::test(flavor = "multi_thread")]
async fn the_double_write_rollout_on_cilium_1_18s_code_is_audited_as_the_stores_hold_it() {
    use crate::support::cilium_rollout::Way;
    let Some(p) = rollout(Way::DoubleWrite, "real::double_write").await else {
        return;
    };
    assert_eq!(
        p.audit, p.truth,
        "audit's counts against both stores: {p:?}"
    );
    // Two sides that allocated the same label sets on their own keep them under different
    // ids: double-write copies what agents use, it does not reconcile.
    assert!(p.truth["double"] > 0, "{p:?}");
    assert_eq!(p.audit_code, 1, "findings exit 1: {p:?}");
}

/// The same rollout carried by `sync --reserve-in-kvstore` reaches cutover, and `audit` again
/// counts what both stores hold.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_rollout_with_sync_reaches_cutover_and_is_audited_as_the_stores_hold_it() {
    use crate::support::cilium_rollout::Way;
    let Some(p) = rollout(Way::Sync, "real::rollout_with_sync").await else {
        return;
    };
    assert_eq!(p.sync_exit, Some(0), "sync: {}", p.sync_output);
    assert!(
        p.sync_output.contains("cutover reached"),
        "{}",
        p.sync_output
    );
    assert_eq!(
        p.audit, p.truth,
        "audit's counts against both stores: {p:?}"
    );
    // Every agent ends in CRD mode reading the objects sync wrote: no id means two label sets
    // to them. (A label set may still be at two ids, a decided duplicate: both objects carry
    // its labels, so policy selects both.)
    assert_eq!(p.end_splits, 0, "{p:?}");
}

/// A sync of the binary with its own decision log, its output going to `out`.
fn spawn_sync(dir: &Path, kc: &Path, etcd: &Etcd, log: &str, out: &Path) -> tokio::process::Child {
    spawn_sync_with(dir, kc, etcd, log, out, &[])
}

/// `spawn_sync` with more flags.
fn spawn_sync_with(
    dir: &Path,
    kc: &Path,
    etcd: &Etcd,
    log: &str,
    out: &Path,
    more: &[&str],
) -> tokio::process::Child {
    tokio::process::Command::new(bin())
        .current_dir(dir)
        .args([
            "sync",
            "--decision-log",
            log,
            "--etcd-endpoints",
            &etcd.endpoint,
        ])
        .args(more)
        .arg("--kubeconfig")
        .arg(kc)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// What a sync spawned with `out` printed so far: its output, then its retries and
/// warnings (stderr, beside it), so a failed wait shows why.
pub fn printed(out: &Path) -> String {
    let said = std::fs::read_to_string(out).unwrap_or_default();
    let err = std::fs::read_to_string(out.with_extension("err")).unwrap_or_default();
    format!("{said}\n--- stderr ---\n{err}")
}

/// Waits until `file` holds `text` (`secs` at most).
async fn said(file: &Path, text: &str, secs: u64) {
    let start = Instant::now();
    loop {
        let now = std::fs::read_to_string(file).unwrap_or_default();
        if now.contains(text) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{text:?} not said in {secs} s: {}",
            printed(file)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two syncs on one cluster with the real server's Leases: one writes, the other follows;
/// the writer killed (its Lease not given up), the other takes over and mirrors what comes.
#[tokio::test(flavor = "multi_thread")]
async fn two_syncs_share_one_lease_on_a_real_server_and_the_second_takes_over() {
    let Some(cp) = ControlPlane::start("real::two_syncs") else {
        return;
    };
    let etcd = Etcd::start().await;
    for (id, l) in [(300, A), (301, B)] {
        etcd.put(&format!("{P}/id/{id}"), l.as_bytes()).await;
        etcd.put(
            &format!("{P}/value/{l}/10.0.0.1"),
            id.to_string().as_bytes(),
        )
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (out1, out2) = (d.join("sync1.out"), d.join("sync2.out"));
    let mut first = spawn_sync(d, &cp.kubeconfig, &etcd, "one.jsonl", &out1);
    said(&out1, "taken: this sync writes", 30).await;
    let second = spawn_sync(d, &cp.kubeconfig, &etcd, "two.jsonl", &out2);
    said(&out2, "following both sides without writing", 30).await;
    let start = Instant::now();
    while cp.identities().len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            cp.identities()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The writer dies without giving its Lease up: the second takes it once it lapses.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let killed = Instant::now();
    said(&out2, "taken: this sync writes", 40).await;
    let took_over = killed.elapsed();
    etcd.put(&format!("{P}/id/302"), C.as_bytes()).await;
    let start = Instant::now();
    while !cp.identities().contains_key("302") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "302 never mirrored"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(cp.identities()["302"], security_labels(C));
    assert!(
        took_over < Duration::from_secs(25),
        "took over after {took_over:?}"
    );
    drop(second);
}

/// Waits until the real server holds the object `id` (`secs` at most).
async fn mirrored_on(cp: &ControlPlane, id: &str, secs: u64, what: &str, out: &Path) {
    let start = Instant::now();
    while !cp.identities().contains_key(id) {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what}: {id} not mirrored in {secs} s\n{}",
            printed(out)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sync on the real server through what production does to it: the API server restarted
/// (its watch cache starts empty: the watch gets 410 and sync lists afresh), every
/// connection gone dead behind a proxy (half-open), and sync restarted against an HA peer
/// on the same etcd (a watch cache of its own), resuming from its decision log; objects
/// made through one server reach sync through the other.
#[tokio::test(flavor = "multi_thread")]
async fn sync_on_a_real_server_rides_out_a_restart_dead_connections_and_a_peer() {
    let Some(cp) = ControlPlane::start("real::sync_rides_out") else {
        return;
    };
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/value/{A}/10.0.0.1"), b"300").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Through a proxy, whose connections can be made to go dead.
    let api = crate::proxy::Proxy::start(&cp.url).await;
    let via_proxy = d.join("kubeconfig-proxy");
    let https = api.url().replace("http://", "https://");
    std::fs::write(
        &via_proxy,
        std::fs::read_to_string(&cp.kubeconfig)
            .unwrap()
            .replace(&cp.url, &https),
    )
    .unwrap();
    let status = format!("127.0.0.1:{}", crate::harness::free_port());
    let out = d.join("sync.out");
    let mut first = spawn_sync_with(
        d,
        &via_proxy,
        &etcd,
        "sync.jsonl",
        &out,
        &["--status-addr", &status],
    );
    said(&out, "taken: this sync writes", 60).await;
    mirrored_on(&cp, "300", 30, "at the start", &out).await;

    // 1. The API server restarts: a fresh watch cache, listed at etcd's revision then. A
    // write elsewhere first puts that revision past the last one sync watched from: in a
    // cluster this quiet, a cache listed at exactly sync's version would rightly carry on
    // without a 410 (nothing missed), and the test would race the server's own writes.
    cp.kubectl(&["create", "configmap", "before-the-restart", "-n", "default"]);
    tokio::task::block_in_place(|| cp.restart_apiserver());
    etcd.put(&format!("{P}/id/301"), B.as_bytes()).await;
    mirrored_on(&cp, "301", 90, "after a restart", &out).await;
    // The watch, back on the restarted server, gets 410 and sync lists afresh.
    let restarted = Instant::now();
    loop {
        let (code, _, metrics) =
            crate::harness::http(&format!("http://{status}"), "GET", "/metrics", None).await;
        assert_eq!(code, 200);
        let relists: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("cilium_idmig_kubernetes_relists_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        if relists >= 1.0 {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(90),
            "no fresh list after the restart's 410:\n{}",
            printed(&out)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // 2. Every open connection goes dead without closing.
    api.kill_existing();
    etcd.put(&format!("{P}/id/302"), C.as_bytes()).await;
    mirrored_on(&cp, "302", 90, "after the connections went dead", &out).await;

    // 3. Sync restarted against an HA peer, resuming its log (the same identity on the
    // Lease: it takes it back at once).
    let peer = tokio::task::block_in_place(|| cp.start_peer());
    assert_ne!(peer.url, cp.url);
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let out2 = d.join("sync2.out");
    let _second = spawn_sync(d, &peer.kubeconfig, &etcd, "sync.jsonl", &out2);
    said(&out2, "taken: this sync writes", 60).await;
    // What it writes through the peer, the other server serves.
    let d4 = "k8s:app=d;k8s:io.kubernetes.pod.namespace=shop;";
    etcd.put(&format!("{P}/id/303"), d4.as_bytes()).await;
    mirrored_on(&cp, "303", 60, "through the peer", &out2).await;
    // An agent's object made through the other server reaches it through the peer's cache:
    // the kvstore then takes the id for other labels, a split it reports.
    let e = "k8s:app=e;k8s:io.kubernetes.pod.namespace=shop;";
    cp.create_identity(304, &security_labels(e));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let f = "k8s:app=f;k8s:io.kubernetes.pod.namespace=shop;";
    etcd.put(&format!("{P}/id/304"), f.as_bytes()).await;
    etcd.put(&format!("{P}/value/{f}/10.0.0.2"), b"304").await;
    said(&out2, "split allocation at id 304", 60).await;
    assert_eq!(
        cp.identities()["304"],
        security_labels(e),
        "never overwritten"
    );
    drop(peer);
}

/// An apply killed on the real server once it has written some, then run again with the
/// same command and log: what it wrote at any point is what an uninterrupted run writes (the
/// same run on the sandbox, seeded alike), the rerun converges to it, and verify passes.
#[tokio::test(flavor = "multi_thread")]
async fn an_apply_killed_on_a_real_server_and_run_again_converges_to_the_uninterrupted_state() {
    let Some(cp) = ControlPlane::start("real::apply_killed") else {
        return;
    };
    let etcd = Etcd::start().await;
    let data = crate::harness::load_dataset(&etcd, 2000, 5, 2).await;
    // Both clusters start with the generated objects (CRD-mode agents' and conflicts').
    let items: Vec<serde_json::Value> = data
        .k8s
        .iter()
        .map(|(id, labels)| {
            serde_json::json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumIdentity",
                "metadata": {"name": id.to_string()},
                "security-labels": labels,
            })
        })
        .collect();
    if !items.is_empty() {
        cp.apply(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sb = cilium_idmig::sandbox::Sandbox::start(cilium_idmig::sandbox::SandboxConfig::default())
        .await
        .unwrap();
    for (id, labels) in &data.k8s {
        sb.seed_identity(*id, labels);
    }
    let sb_kc = d.join("kubeconfig-sandbox");
    sb.write_kubeconfig(&sb_kc).unwrap();
    let apply = ["apply", "--yes", "--accept-proposals", "--decision-log"];
    // The uninterrupted run, on the sandbox.
    let mut args = apply.to_vec();
    args.push("clean.jsonl");
    let (r, _) = cli(d, &sb_kc, &etcd, &args, 300).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let expected: BTreeMap<String, BTreeMap<String, String>> = sb
        .objects()
        .into_iter()
        .map(|(name, o)| {
            let labels = serde_json::from_value(o["security-labels"].clone()).unwrap();
            (name, labels)
        })
        .collect();
    assert!(expected.len() > data.k8s.len() + 1000, "{}", expected.len());
    // The same run on the real server, killed once it has written a hundred.
    let before = cp.identities().len();
    let mut child = tokio::process::Command::new(bin())
        .current_dir(d)
        .args(apply)
        .args(["real.jsonl", "--etcd-endpoints", &etcd.endpoint])
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .env_remove("KUBECONFIG")
        .env("HOME", d)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while cp.identities().len() < before + 100 {
        assert!(start.elapsed() < Duration::from_secs(120), "no writes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let partial = cp.identities();
    assert!(
        partial.len() < expected.len(),
        "killed after the end: {}",
        partial.len()
    );
    for (name, labels) in &partial {
        assert_eq!(
            expected.get(name),
            Some(labels),
            "{name} is not what an uninterrupted run writes"
        );
    }
    // Run again, the same command and log: the rest, and nothing else.
    let mut args = apply.to_vec();
    args.push("real.jsonl");
    let (r, _) = cli(d, &cp.kubeconfig, &etcd, &args, 300).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(cp.identities(), expected, "the rerun converges");
    let (v, _) = cli(
        d,
        &cp.kubeconfig,
        &etcd,
        &["verify", "--decision-log", "real.jsonl"],
        120,
    )
    .await;
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    eprintln!(
        "killed at {} of {} objects; the rerun converged",
        partial.len(),
        expected.len()
    );
}

/// Kubernetes 1.36 over Debian's etcd 3.4 refuses a streaming list (`RequestWatchProgress` is
/// missing) with an ERROR event: the tool falls back to paged lists for the rest of the
/// process, says so once, and plan, apply and verify work as on any server.
#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_list_the_server_refuses_falls_back_to_pages_once() {
    let Some(cp) = ControlPlane::start_with(
        "real::a_streaming_list_the_server_refuses_falls_back_to_pages_once",
        &[("KUBE_VERSION", "1.36"), ("ETCD", "etcd")],
    ) else {
        return;
    };
    assert!(cp.version().starts_with("v1.36"), "{}", cp.version());
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/id/301"), B.as_bytes()).await;
    cp.create_identity(301, &security_labels(B));
    let dir = tempfile::tempdir().unwrap();
    let fallback = "reading lists in pages from now on";
    let (r, _) = cli(dir.path(), &cp.kubeconfig, &etcd, &["plan"], 60).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        r.stderr.matches(fallback).count(),
        1,
        "said once: {}",
        r.stderr
    );
    assert!(r.stderr.contains("RequestWatchProgress"), "{}", r.stderr);
    assert!(
        r.stdout.contains("already-migrated       1"),
        "{}",
        r.stdout
    );
    // apply reads both sides, then verifies: one process, one line.
    let log = dir.path().join("d.jsonl");
    let (r, _) = cli(
        dir.path(),
        &cp.kubeconfig,
        &etcd,
        &["apply", "--yes", "--decision-log", log.to_str().unwrap()],
        60,
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.matches(fallback).count() <= 1, "{}", r.stderr);
    assert_eq!(cp.identities().len(), 2);
    let (r, _) = cli(dir.path(), &cp.kubeconfig, &etcd, &["verify"], 60).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

/// An overlay of `deploy/` in a new temp folder: `resources` the base, plus `extra` lines.
fn overlay_of_deploy(extra: &str) -> tempfile::TempDir {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let dir = tempfile::tempdir().unwrap();
    // Relative, as kustomize wants: up from the temp folder to the root, then down.
    let depth = dir.path().components().count() - 1;
    let back: std::path::PathBuf = std::iter::repeat_n("..", depth).collect();
    let base = back.join(deploy.strip_prefix("/").unwrap());
    let text = format!(
        "resources: [{}]\n{}",
        base.display(),
        extra.replace("BASE", &base.display().to_string())
    );
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    dir
}

/// The workload on today's Kubernetes: `deploy/` applies (server-side, dry run) in a
/// namespace that enforces Pod Security `restricted` with no warning, and the flowcontrol
/// component's FlowSchema and PriorityLevelConfiguration (flowcontrol v1) are accepted.
#[tokio::test(flavor = "multi_thread")]
async fn the_workload_applies_on_1_36_under_restricted_pod_security_with_its_flow_schema() {
    let Some(cp) = ControlPlane::start_with(
        "real::the_workload_applies_on_1_36_under_restricted_pod_security_with_its_flow_schema",
        &[("KUBE_VERSION", "1.36")],
    ) else {
        return;
    };
    let apply = |dir: &Path| {
        let out = cp.kubectl_as(
            &cp.kubeconfig,
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-k",
                dir.to_str().unwrap(),
            ],
            None,
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    cp.kubectl(&["create", "namespace", "idmig-restricted"]);
    cp.kubectl(&[
        "label",
        "namespace",
        "idmig-restricted",
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    ]);
    let restricted = overlay_of_deploy("namespace: idmig-restricted\n");
    let (ok, stdout, stderr) = apply(restricted.path());
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("job.batch/cilium-idmig-sync serverside-applied"),
        "{stdout}"
    );
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "no warning: {stderr}"
    );
    let with_flows = overlay_of_deploy("components: [BASE/components/flowcontrol]\n");
    let (ok, stdout, stderr) = apply(with_flows.path());
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("flowschema.flowcontrol.apiserver.k8s.io/cilium-idmig serverside-applied")
            && stdout.contains("prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/cilium-idmig serverside-applied"),
        "{stdout}"
    );
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "no warning: {stderr}"
    );
}

/// The server's `Warning` headers, as a real server sends them for a CRD version marked
/// deprecated: shown once per distinct text on stderr (as kubectl shows them), in apply's
/// JSON report and in the decision log's record of the run.
#[tokio::test(flavor = "multi_thread")]
async fn a_deprecated_crd_version_is_warned_of_once_and_recorded() {
    let Some(cp) = ControlPlane::start("real::a_deprecated_crd_version_is_warned_of") else {
        return;
    };
    let text = "cilium.io/v2 CiliumIdentity is deprecated in this test";
    let patch = format!(
        r#"[{{"op":"add","path":"/spec/versions/0/deprecated","value":true}},{{"op":"add","path":"/spec/versions/0/deprecationWarning","value":"{text}"}}]"#
    );
    cp.kubectl(&[
        "patch",
        "crd",
        "ciliumidentities.cilium.io",
        "--type=json",
        "-p",
        &patch,
    ]);
    let etcd = Etcd::start().await;
    for (id, labels) in [(300, A), (301, B), (302, C)] {
        etcd.put(&format!("{P}/id/{id}"), labels.as_bytes()).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let (d, kc) = (dir.path(), cp.kubeconfig.as_path());
    let log = d.join("apply.jsonl").display().to_string();
    // The CRD's change reaches the API server's handlers a moment after the patch.
    let shown = format!("Warning: {text}");
    let mut r = None;
    for _ in 0..20 {
        let (plan, _) = cli(d, kc, &etcd, &["plan"], 120).await;
        assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
        if plan.stderr.contains(&shown) {
            r = Some(plan);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let plan = r.unwrap_or_else(|| panic!("plan never showed {shown:?}"));
    assert_eq!(plan.stderr.matches(&shown).count(), 1, "{}", plan.stderr);
    let (r, _) = cli(
        d,
        kc,
        &etcd,
        &["apply", "--yes", "--decision-log", &log, "--json"],
        120,
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.stderr.matches(&shown).count(), 1, "{}", r.stderr);
    assert_eq!(cp.identities().len(), 3);
    let json = &r.stdout[..r.stdout.rfind("\n}").unwrap() + 2];
    let report: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(report["server_warnings"], serde_json::json!([text]));
    let recorded = std::fs::read_to_string(&log).unwrap();
    assert!(
        recorded
            .lines()
            .any(|l| l.contains("server_said") && l.contains(text)),
        "{recorded}"
    );
}

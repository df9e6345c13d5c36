//! The switch report at a full cluster, on the real kube-apiserver (1.19 over etcd 3.4, or
//! 1.36 over etcd 3.6 with `KUBE_VERSION=1.36`): `IDMIG_SWITCH_IDENTITIES` CiliumIdentity
//! objects (default 65,000), `IDMIG_SWITCH_PODS` pods (default 20,000, ten to a label set,
//! in 100 namespaces) and a CiliumEndpoint per pod. Side by side in one run, three rounds
//! alternating: the three lists read by a plain client (kube's `Api`, pages of 500, one after
//! the other and all at once), and `switch-report --output json` as a whole process with its
//! peak RSS. Half the label sets have their exact identity, a quarter a near one (without
//! the namespace's name label), a quarter none; the other identities are unused.
//!
//! `IDMIG_SWITCH_HOLD=1` keeps the cluster up after the rounds, its kubeconfig on stderr, for
//! profiling by hand.
//!
//! `cargo bench --bench switch` (with `KUBEBUILDER_ASSETS` and `CONTROL_PLANE` set as for
//! the tests; without them it says so and ends). Prints a Markdown report.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::control_plane::ControlPlane;
use support::proc_stats::bench_bin;

const NAMESPACES: usize = 100;
const PODS_PER_SET: usize = 10;
const IN_FLIGHT: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace(['_', ','], "").parse().ok())
        .unwrap_or(default)
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The security labels 1.18's operator computes for label set `set` (namespace `ns-<k>`)
/// on this server, in cluster `default`.
fn operator_set(set: usize, ns_name_label: bool) -> BTreeMap<String, String> {
    let ns = format!("ns-{}", set % NAMESPACES);
    let mut m = BTreeMap::from([
        ("k8s:app".to_string(), format!("app-{set}")),
        (
            "k8s:io.cilium.k8s.policy.cluster".to_string(),
            "default".to_string(),
        ),
        ("k8s:io.kubernetes.pod.namespace".to_string(), ns.clone()),
    ]);
    if ns_name_label {
        m.insert(
            "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name".into(),
            ns,
        );
    }
    m
}

/// Creates every object through `IN_FLIGHT` concurrent requests.
async fn create_all(
    api_of: impl Fn(&str) -> kube::Api<DynamicObject>,
    objects: Vec<(String, DynamicObject)>,
) {
    futures::stream::iter(objects)
        .map(|(ns, o)| {
            let api = api_of(&ns);
            async move {
                let mut tries = 0;
                loop {
                    match api.create(&PostParams::default(), &o).await {
                        Ok(_) => return,
                        Err(e) if tries < 5 => {
                            tries += 1;
                            eprintln!("create {:?}: {e}; again", o.metadata.name);
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Err(e) => panic!("create {:?}: {e}", o.metadata.name),
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// Builds the cluster: namespaces, identities, pods, endpoints.
async fn populate(cp: &ControlPlane, identities: usize, pods: usize, ns_name_label: bool) {
    let c = cp.client().await;
    let sets = pods.div_ceil(PODS_PER_SET);
    let ns_api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(c.clone());
    for k in 0..NAMESPACES {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("ns-{k}")}}))
                .expect("namespace");
        ns_api
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
    }
    // Identities: sets 0..sets/2 exact, the next quarter near (no namespace name label, so
    // near only where the server adds it), the rest of the ids unused.
    let cid = resource("cilium.io", "v2", "CiliumIdentity", "ciliumidentities");
    let mut objects = Vec::with_capacity(identities);
    for i in 0..identities {
        let id = 256 + i;
        let labels = if i < sets / 2 {
            operator_set(i, ns_name_label)
        } else if i < sets * 3 / 4 {
            let mut m = operator_set(i, ns_name_label);
            m.remove("k8s:io.cilium.k8s.policy.cluster");
            m
        } else {
            let mut m = operator_set(i, ns_name_label);
            m.insert("k8s:app".into(), format!("gone-{i}"));
            m
        };
        let mut o = DynamicObject::new(&id.to_string(), &cid);
        o.data = serde_json::json!({ "security-labels": labels });
        objects.push((String::new(), o));
    }
    let started = Instant::now();
    create_all(|_| kube::Api::all_with(c.clone(), &cid), objects).await;
    eprintln!(
        "{identities} identities in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let pod_res = resource("", "v1", "Pod", "pods");
    let cep = resource("cilium.io", "v2", "CiliumEndpoint", "ciliumendpoints");
    let mut pod_objects = Vec::with_capacity(pods);
    let mut endpoints = Vec::with_capacity(pods);
    for p in 0..pods {
        let set = p / PODS_PER_SET;
        let ns = format!("ns-{}", set % NAMESPACES);
        let name = format!("pod-{p}");
        let mut o = DynamicObject::new(&name, &pod_res).within(&ns);
        o.metadata.labels = Some(BTreeMap::from([("app".to_string(), format!("app-{set}"))]));
        o.data = serde_json::json!({"spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "x"}]}});
        pod_objects.push((ns.clone(), o));
        // Its endpoint names the identity its set has, else one past the range's used part.
        let id = if set < sets * 3 / 4 {
            256 + set
        } else {
            256 + identities + set
        };
        let mut e = DynamicObject::new(&name, &cep).within(&ns);
        e.data = serde_json::json!({"status": {"identity": {"id": id}}});
        endpoints.push((ns, e));
    }
    let started = Instant::now();
    create_all(
        |ns| kube::Api::namespaced_with(c.clone(), ns, &pod_res),
        pod_objects,
    )
    .await;
    create_all(
        |ns| kube::Api::namespaced_with(c.clone(), ns, &cep),
        endpoints,
    )
    .await;
    eprintln!(
        "{pods} pods and endpoints in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Lists every object of `res` in pages of 500, as the tool does; how many.
async fn list_all(c: kube::Client, res: ApiResource) -> usize {
    let api: kube::Api<DynamicObject> = kube::Api::all_with(c, &res);
    let mut params = ListParams::default().limit(500);
    let mut n = 0;
    loop {
        let page = api.list(&params).await.expect("list");
        n += page.items.len();
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => params = params.continue_token(&t),
            None => return n,
        }
    }
}

fn the_three() -> [ApiResource; 3] {
    [
        resource("cilium.io", "v2", "CiliumIdentity", "ciliumidentities"),
        resource("", "v1", "Pod", "pods"),
        resource("cilium.io", "v2", "CiliumEndpoint", "ciliumendpoints"),
    ]
}

/// The three lists one after the other; how long.
async fn lists_in_turn(c: &kube::Client) -> Duration {
    let start = Instant::now();
    for res in the_three() {
        list_all(c.clone(), res).await;
    }
    start.elapsed()
}

/// The three lists at once; how long.
async fn lists_at_once(c: &kube::Client) -> Duration {
    let start = Instant::now();
    let [a, b, e] = the_three();
    tokio::join!(
        list_all(c.clone(), a),
        list_all(c.clone(), b),
        list_all(c.clone(), e)
    );
    start.elapsed()
}

/// `switch-report --output json` under `/usr/bin/time`: wall time, peak RSS (MiB), pods.
fn report(dir: &Path, kc: &Path) -> (Duration, f64, usize) {
    let start = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "IDMIG_MAXRSS=%M"])
        .arg(bench_bin())
        .args(["switch-report", "--output", "json", "--kubeconfig"])
        .arg(kc)
        .current_dir(dir)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("/usr/bin/time (Debian package time)");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rss = support::proc_stats::max_rss_mib(&stderr).unwrap_or(0.0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("switch-report: {e}: {stderr}"));
    let pods = v["counts"]["pods"].as_u64().unwrap_or(0) as usize;
    (took, rss, pods)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("switch benchmark: run it with `cargo bench --bench switch`");
        return;
    }
    let identities = env_usize("IDMIG_SWITCH_IDENTITIES", 65_000);
    let pods = env_usize("IDMIG_SWITCH_PODS", 20_000);
    let vars = [(
        "EXTRA_APISERVER_FLAGS",
        "--disable-admission-plugins=ServiceAccount",
    )];
    let Some(cp) = ControlPlane::start_with("bench::switch", &vars) else {
        return;
    };
    let version = cp.version();
    let ns_name_label = !version.starts_with("v1.19");
    populate(&cp, identities, pods, ns_name_label).await;
    let c = cp.client().await;
    let dir = tempfile::tempdir().expect("dir");
    let (mut in_turn, mut at_once, mut took, mut rss) = (vec![], vec![], vec![], vec![]);
    for round in 0..3 {
        in_turn.push(lists_in_turn(&c).await.as_secs_f64());
        at_once.push(lists_at_once(&c).await.as_secs_f64());
        let (t, r, n) = report(dir.path(), &cp.kubeconfig);
        assert_eq!(n, pods, "the report covers every pod");
        took.push(t.as_secs_f64());
        rss.push(r);
        eprintln!(
            "round {round}: lists {:.2} s in turn, {:.2} s at once; report {:.2} s, {r:.0} MiB",
            in_turn[round], at_once[round], took[round]
        );
    }
    if std::env::var("IDMIG_SWITCH_HOLD").is_ok() {
        eprintln!(
            "holding the cluster: cilium-idmig switch-report --kubeconfig {}; Ctrl-C ends",
            cp.kubeconfig.display()
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    let (turn, once, rep) = (median(in_turn), median(at_once), median(took));
    println!(
        "### switch-report on kube-apiserver {version} ({identities} identities, {pods} pods and endpoints)\n"
    );
    println!(
        "| the three lists, in turn | at once | `switch-report` | report / lists in turn | peak RSS |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {turn:.2} s | {once:.2} s | {rep:.2} s | {:.2}x | {:.0} MiB |",
        rep / turn,
        rss.iter().cloned().fold(0.0, f64::max)
    );
}

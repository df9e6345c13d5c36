//! Sync as the cluster workload of `deploy/`, on the real API server: the kustomize base
//! accepted (`--dry-run=server`, then applied and deleted), and the binary run as a pod of
//! the base's Job sees the cluster, since no kubelet schedules pods here: the Job's own
//! arguments, `KUBERNETES_SERVICE_HOST`/`PORT`, a TokenRequest token of the base's
//! ServiceAccount with the CA and namespace at the pod's path, the etcd config and the
//! decisions where the Job mounts them (a private mount namespace, bind and overlay mounts),
//! no kubeconfig, the Job's user; and exactly the base's permissions.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::harness::{Etcd, bin, free_port};
use crate::real::printed;
use crate::support::control_plane::{ControlPlane, skip};

const P: &str = "cilium/state/identities/v1";
const A: &str = "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;";
const B: &str = "k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;";
const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");
/// The Job's user (its securityContext).
const POD_USER: &str = "65532";

/// `kubectl kustomize` of a folder: each object of the build.
pub fn kustomized(dir: &str) -> Vec<serde_json::Value> {
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", dir])
        .output()
        .expect("kubectl (Debian's kubernetes-client)");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n---\n")
        .map(|doc| serde_yaml_ng::from_str(doc).unwrap())
        .collect()
}

/// The object of `kind` named `name` in a build.
pub fn object<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the build"))
}

/// The arguments of the Job's container, as the manifest gives them.
pub fn job_args(docs: &[serde_json::Value]) -> Vec<String> {
    object(docs, "Job", "cilium-idmig-sync")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// What a pod of the Job would find on its disk, kept in a folder the mounts come from:
/// `sa/` (the ServiceAccount's files), `etcd-config/`, `decisions/` (the ConfigMap) and
/// `log/` (the volume). Token and decisions are replaced as the kubelet replaces them.
struct PodFiles {
    dir: tempfile::TempDir,
}

impl PodFiles {
    fn new(cp: &ControlPlane, etcd: &Etcd, token: &str) -> PodFiles {
        let files = PodFiles {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in [
            "sa",
            "etcd-config",
            "decisions",
            "log",
            "etc-up",
            "etc-work",
            "lib-up",
            "lib-work",
        ] {
            std::fs::create_dir(files.path(d)).unwrap();
        }
        std::fs::copy(cp.ca_file(), files.path("sa/ca.crt")).unwrap();
        std::fs::write(files.path("sa/namespace"), "kube-system").unwrap();
        files.replace("sa", "token", token.as_bytes());
        let config = format!("endpoints:\n- {}\n", etcd.endpoint);
        std::fs::write(files.path("etcd-config/etcd.config"), config).unwrap();
        std::fs::copy(bin(), files.path("cilium-idmig")).unwrap();
        // The pod's user reads what the kubelet mounts and writes its volume; nothing else.
        let chmod = |p: &Path, mode| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        chmod(files.dir.path(), 0o755);
        for d in ["sa", "etcd-config", "decisions"] {
            chmod(&files.path(d), 0o755);
        }
        let uid = POD_USER.parse::<u32>().unwrap();
        std::os::unix::fs::chown(files.path("log"), Some(uid), Some(uid)).unwrap();
        files
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Puts `name` in folder `dir` as the kubelet's atomic writer does: a new timestamped
    /// folder, the `..data` link swapped to it in one rename, `name` a link through `..data`.
    fn replace(&self, dir: &str, name: &str, bytes: &[u8]) {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let base = self.path(dir);
        let version = format!(
            "..{}",
            std::time::SystemTime::UNIX_EPOCH
                .elapsed()
                .unwrap()
                .as_nanos()
        );
        std::fs::create_dir(base.join(&version)).unwrap();
        let file = base.join(&version).join(name);
        std::fs::write(&file, bytes).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(base.join(&version), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let _ = std::fs::remove_file(base.join("..data_tmp"));
        symlink(&version, base.join("..data_tmp")).unwrap();
        std::fs::rename(base.join("..data_tmp"), base.join("..data")).unwrap();
        if !base.join(name).exists() {
            symlink(format!("..data/{name}"), base.join(name)).unwrap();
        }
    }

    /// The binary as the Job's container runs it, `args` its arguments: in a mount
    /// namespace of its own where the pod's paths hold these files, as the pod's user, with
    /// only the environment a pod gets from the kubelet. Output to `out` (and `.err`).
    fn spawn(&self, cp: &ControlPlane, args: &[String], out: &Path) -> tokio::process::Child {
        let port = cp.url.rsplit(':').next().unwrap().trim_end_matches('/');
        let script = r#"set -e
D=$1; shift
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind "$D/sa" /run/secrets/kubernetes.io/serviceaccount
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$D/etc-up,workdir=$D/etc-work" /etc
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$D/lib-up,workdir=$D/lib-work" /var/lib
mkdir -p /etc/cilium-idmig/decisions /var/lib/etcd-config /var/lib/etcd-secrets /var/lib/cilium-idmig
mount --bind "$D/decisions" /etc/cilium-idmig/decisions
mount --bind "$D/etcd-config" /var/lib/etcd-config
mount --bind "$D/log" /var/lib/cilium-idmig
exec setpriv --reuid "$USER_ID" --regid "$USER_ID" --clear-groups \
  env -i KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT="$PORT" "$D/cilium-idmig" "$@"
"#;
        tokio::process::Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(self.dir.path())
            .args(args)
            .env("USER_ID", POD_USER)
            .env("PORT", port)
            .stdout(std::fs::File::create(out).unwrap())
            .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }
}

/// A real control plane, where this test can also make a pod's view; `None` (said why)
/// otherwise.
fn control_plane_for_pods(test: &str) -> Option<ControlPlane> {
    can_make_pods(test)
        .then(|| ControlPlane::start(test))
        .flatten()
}

/// Whether this test can make a pod's view here (root, for mount namespaces and mounts);
/// says why not otherwise.
fn can_make_pods(test: &str) -> bool {
    let ok = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs tmpfs /mnt && mkdir /mnt/u /mnt/w && mount -t overlay overlay -o lowerdir=/etc,upperdir=/mnt/u,workdir=/mnt/w /etc && command -v setpriv >/dev/null")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(
            test,
            "a pod's view needs a private mount namespace, tmpfs and overlay mounts, and setpriv (run as root)",
        );
    }
    ok
}

/// A TokenRequest token of the base's ServiceAccount, bound to a Secret of `name` (created
/// here): deleting that Secret ends the token at once, as an expiry would.
fn token_bound_to(cp: &ControlPlane, name: &str) -> String {
    cp.kubectl(&["-n", "kube-system", "create", "secret", "generic", name]);
    let uid = cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "secret",
        name,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    cp.kubectl(&[
        "-n",
        "kube-system",
        "create",
        "token",
        "cilium-idmig",
        "--bound-object-kind",
        "Secret",
        "--bound-object-name",
        name,
        "--bound-object-uid",
        uid.trim(),
    ])
    .trim()
    .to_string()
}

/// The Job's arguments for a test: its status port on a free one, and a short grace (the
/// kvstore-mode node here is a key the test deletes, not an agent whose lease lapses).
fn test_args(docs: &[serde_json::Value], status_port: u16) -> Vec<String> {
    let mut args: Vec<String> = job_args(docs)
        .into_iter()
        .map(|a| match a.strip_prefix("--status-addr=") {
            Some(_) => format!("--status-addr=127.0.0.1:{status_port}"),
            None => a,
        })
        .collect();
    args.push("--cutover-grace=2s".into());
    args
}

async fn until(what: &str, secs: u64, out: &Path, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what}: not within {secs} s\n{}",
            printed(out)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether the API server takes `token` (no kubeconfig: the token alone, as a pod sends it).
fn accepted(cp: &ControlPlane, token: &str) -> bool {
    std::process::Command::new("kubectl")
        .args([
            "--kubeconfig",
            "/dev/null",
            "--server",
            &cp.url,
            "--token",
            token,
        ])
        .arg("--certificate-authority")
        .arg(cp.ca_file())
        .args(["get", "--raw", "/apis/cilium.io/v2/ciliumidentities"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn labels_of(key: &str) -> std::collections::BTreeMap<String, String> {
    let parsed = cilium_idmig::core::labels::parse_label_key(key).unwrap();
    cilium_idmig::core::labels::to_security_labels(&parsed)
        .into_iter()
        .collect()
}

/// A decision log of one review on a bastion: the operator remaps `id` (labels) to `target`.
fn review_remapping(dir: &Path, id: &str, labels: &str, target: u32) -> PathBuf {
    let record = serde_json::json!({
        "ts": "2026-12-02T10:00:00Z", "operator": "alice@bastion", "id": id, "labels": labels,
        "kind": "remap", "decision": "create (operator)", "decided_by": "operator",
        "action": "create", "target_id": target, "outcome": null, "error": null,
    });
    let path = dir.join("review.jsonl");
    std::fs::write(&path, format!("{record}\n")).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deploy_base_runs_sync_in_the_cluster_to_cutover_with_its_own_permissions() {
    const TEST: &str = "in_cluster::the_deploy_base_runs_sync";
    let Some(cp) = control_plane_for_pods(TEST) else {
        return;
    };
    // The server accepts the whole base, then it is applied as the docs say.
    cp.kubectl(&["apply", "--dry-run=server", "-k", DEPLOY]);
    cp.kubectl(&["apply", "-k", DEPLOY]);
    let docs = kustomized(DEPLOY);

    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    // 301 is taken in Kubernetes by other labels: a conflict that waits for a decision.
    etcd.put(&format!("{P}/id/301"), B.as_bytes()).await;
    etcd.put(&format!("{P}/value/{B}/node-1"), b"301").await;
    let other = labels_of("k8s:app=other;k8s:io.kubernetes.pod.namespace=shop;");
    cp.create_identity(301, &other);

    let token_a = token_bound_to(&cp, "sync-token-a");
    let pod = PodFiles::new(&cp, &etcd, &token_a);
    let out = pod.path("sync.out");
    let status = free_port();
    let mut sync = pod.spawn(&cp, &test_args(&docs, status), &out);
    until("300 mirrored", 60, &out, || {
        cp.identities().contains_key("300")
    })
    .await;
    until("the conflict said", 30, &out, || {
        printed(&out).contains("conflict: 301")
    })
    .await;

    // The kubelet replaces the token; the old one ends (its Secret deleted, as an expiry).
    let token_b = token_bound_to(&cp, "sync-token-b");
    pod.replace("sa", "token", token_b.as_bytes());
    cp.kubectl(&["-n", "kube-system", "delete", "secret", "sync-token-a"]);
    until("the old token refused", 20, &out, || {
        !accepted(&cp, &token_a)
    })
    .await;

    // The operator decides on the bastion; the export goes into the ConfigMap's file.
    let bastion = tempfile::tempdir().unwrap();
    let review = review_remapping(bastion.path(), "301", B, 4000);
    let export = crate::harness::run(
        bastion.path(),
        &["log", "--decisions-only", review.to_str().unwrap()],
    )
    .await;
    assert_eq!(export.code, 0, "{}", export.stderr);
    pod.replace("decisions", "decisions.jsonl", export.stdout.as_bytes());
    until("the decision carried out", 30, &out, || {
        cp.identities().contains_key("4000")
    })
    .await;
    assert!(
        printed(&out).contains(
            "decisions file /etc/cilium-idmig/decisions/decisions.jsonl changed: 1 decision"
        ),
        "{}",
        printed(&out)
    );

    // The last node leaves kvstore mode: cutover, and the Job's sync ends with 0.
    etcd.delete(&format!("{P}/value/{A}/node-1")).await;
    etcd.delete(&format!("{P}/value/{B}/node-1")).await;
    let ended = tokio::time::timeout(Duration::from_secs(90), sync.wait())
        .await
        .unwrap_or_else(|_| panic!("no cutover in 90 s\n{}", printed(&out)))
        .unwrap();
    assert_eq!(ended.code(), Some(0), "{}", printed(&out));
    assert!(printed(&out).contains("cutover"), "{}", printed(&out));
    assert_eq!(cp.identities()["300"], labels_of(A));
    assert_eq!(cp.identities()["4000"], labels_of(B));
    assert_eq!(cp.identities()["301"], other, "never overwritten");

    // The record, read from the volume as `kubectl exec` would: complete, and verify takes it
    // with the decisions.
    let log_file = pod.path("log/rollout.jsonl");
    let read = crate::harness::run(bastion.path(), &["log", log_file.to_str().unwrap()]).await;
    assert_eq!(read.code, 0, "{}", read.stderr);
    assert_eq!(read.stdout, std::fs::read_to_string(&log_file).unwrap());
    std::fs::write(bastion.path().join("rollout.jsonl"), &read.stdout).unwrap();
    std::fs::write(bastion.path().join("decisions.jsonl"), &export.stdout).unwrap();
    let kc = cp.kubeconfig.to_str().unwrap().to_string();
    let verify = crate::harness::run(
        bastion.path(),
        &[
            "verify",
            "--kubeconfig",
            &kc,
            "--etcd-endpoints",
            &etcd.endpoint,
            "--decision-log",
            "rollout.jsonl",
            "decisions.jsonl",
        ],
    )
    .await;
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);

    // And it all goes as the docs say (not waiting: without a controller manager here,
    // nothing removes the PVC's protection finalizer).
    cp.kubectl(&["delete", "--wait=false", "-k", DEPLOY]);
    let left = cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "serviceaccounts,jobs,roles,rolebindings",
        "-o",
        "name",
    ]);
    assert!(!left.contains("cilium-idmig"), "{left}");
    let cluster_wide = cp.kubectl(&["get", "clusterroles,clusterrolebindings", "-o", "name"]);
    assert!(!cluster_wide.contains("/cilium-idmig"), "{cluster_wide}");
}

/// The base's roles with one rule taken out at a time: sync, run as the Job's pod, ends with
/// exit 2 and says what to grant. (The ClusterRole's selfsubjectaccessreviews rule is for
/// the preflight of the other commands, and Kubernetes' own system:basic-user grants it to
/// every user anyway; the CRD's create is for `apply` before the CRD exists.)
#[tokio::test(flavor = "multi_thread")]
async fn sync_in_the_cluster_without_one_rule_of_its_roles_exits_2_naming_the_grant() {
    const TEST: &str = "in_cluster::without_one_rule";
    let Some(cp) = control_plane_for_pods(TEST) else {
        return;
    };
    cp.kubectl(&["apply", "-k", DEPLOY]);
    let docs = kustomized(DEPLOY);
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    let token = cp
        .kubectl(&["-n", "kube-system", "create", "token", "cilium-idmig"])
        .trim()
        .to_string();
    // The Lease's rules first: the others take the Lease (it exists from then on).
    let cases = [
        (
            "Role",
            "cilium-idmig-sync-lease",
            0,
            "grant get, create and update on leases",
        ),
        (
            "Role",
            "cilium-idmig-sync-lease",
            1,
            "grant get, create and update on leases",
        ),
        ("ClusterRole", "cilium-idmig", 0, "ciliumidentities"),
        (
            "ClusterRole",
            "cilium-idmig",
            1,
            "customresourcedefinitions",
        ),
    ];
    for (kind, name, rule, says) in cases {
        let whole = object(&docs, kind, name).clone();
        let mut less = whole.clone();
        less["rules"].as_array_mut().unwrap().remove(rule);
        cp.apply(&less.to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let pod = PodFiles::new(&cp, &etcd, &token);
        let out = pod.path("sync.out");
        let sync = pod.spawn(&cp, &test_args(&docs, free_port()), &out);
        let ended = tokio::time::timeout(Duration::from_secs(60), sync.wait_with_output())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{kind} {name} without rule {rule}: still running\n{}",
                    printed(&out)
                )
            })
            .unwrap();
        let said = printed(&out);
        assert_eq!(
            ended.status.code(),
            Some(2),
            "{kind} {name} without rule {rule}: {said}"
        );
        for word in ["refused", says] {
            assert!(
                said.contains(word),
                "{kind} {name} without rule {rule}: {word:?} not said: {said}"
            );
        }
        cp.apply(&whole.to_string());
    }
    assert!(
        cp.identities().is_empty(),
        "nothing written without the rights"
    );
}

//! API Priority and Fairness pushing back for real: on kube-apiserver 1.36 (flowcontrol v1),
//! a user bound by RBAC (requests of `system:masters` are exempt) whose priority level
//! rejects what it cannot serve at once. The writes and reads are throttled (429), waited
//! out, and every identity is still created. It always starts 1.36: flowcontrol v1 is not
//! served by 1.19 (it came in 1.29).

use std::time::Duration;

use crate::harness::{Etcd, Run, bin};
use crate::support::control_plane::ControlPlane;

/// `limited-user` may migrate (the ClusterRole of `assets/clusterrole.yaml`), and its
/// requests go to a priority level of one seat that rejects at once instead of queueing.
const LIMITED_AND_REJECTED: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: cilium-idmig-limited-user
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cilium-idmig
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: limited-user
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata:
  name: one-seat-rejecting
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 1
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse:
      type: Reject
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: limited-user-one-seat
spec:
  priorityLevelConfiguration:
    name: one-seat-rejecting
  matchingPrecedence: 500
  distinguisherMethod:
    type: ByUser
  rules:
    - subjects:
        - kind: User
          user:
            name: limited-user
      resourceRules:
        - verbs: ["*"]
          apiGroups: ["*"]
          resources: ["*"]
          clusterScope: true
          namespaces: ["*"]
      nonResourceRules:
        - verbs: ["*"]
          nonResourceURLs: ["*"]
"#;

async fn cli(dir: &std::path::Path, cp: &ControlPlane, etcd: &Etcd, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(bin())
        .current_dir(dir)
        .args(args)
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig_user)
        .args(["--etcd-endpoints", &etcd.endpoint])
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .unwrap_or_else(|_| panic!("{args:?} still running after 300 s"))
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn api_priority_and_fairness_pushes_back_and_every_identity_is_still_created() {
    let test = "throttling::api_priority_and_fairness_pushes_back";
    let flags = (
        "EXTRA_APISERVER_FLAGS",
        "--max-requests-inflight=20 --max-mutating-requests-inflight=10",
    );
    let Some(cp) = ControlPlane::start_with(test, &[("KUBE_VERSION", "1.36"), flags]) else {
        return;
    };
    let role = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/clusterrole.yaml"
    ))
    .unwrap();
    cp.apply(role.split("\n---\n").next().expect("the ClusterRole"));
    cp.apply(LIMITED_AND_REJECTED);
    let etcd = Etcd::start().await;
    let n = 400;
    for i in 0..n {
        let id = 1000 + i;
        let labels = format!("k8s:app=a{i};k8s:io.kubernetes.pod.namespace=shop;");
        etcd.put(
            &format!("cilium/state/identities/v1/id/{id}"),
            labels.as_bytes(),
        )
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("apply.jsonl").display().to_string();
    let args = [
        "apply",
        "--yes",
        "--decision-log",
        &log,
        "--concurrency",
        "32",
        "--max-attempts",
        "2",
        "--json",
    ];
    let r = cli(d, &cp, &etcd, &args).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let json = &r.stdout[..r.stdout.rfind("\n}").unwrap() + 2];
    let report: serde_json::Value = serde_json::from_str(json).unwrap();
    let throttled = report["throttled"].as_u64().unwrap();
    assert!(throttled > 0, "the server never pushed back: {json}");
    assert_eq!(cp.identities().len(), n as usize);
    let failed = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["outcome"] != "created")
        .count();
    assert_eq!(failed, 0, "a 429 is no failure");
    let recorded = std::fs::read_to_string(&log).unwrap();
    let said = recorded
        .lines()
        .find(|l| l.contains("server_said"))
        .unwrap_or_else(|| panic!("no record of the push-back: {recorded}"));
    let said: serde_json::Value = serde_json::from_str(said).unwrap();
    assert_eq!(said["server_said"]["throttled"].as_u64(), Some(throttled));
    // The check after it, as the same user: verify reads all through the same level.
    let r = cli(d, &cp, &etcd, &["verify", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

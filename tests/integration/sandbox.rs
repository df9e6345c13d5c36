//! The sandbox API server follows the Kubernetes API conventions, and the Kubernetes target
//! reads it the way it reads a real API server.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use cilium_idmig::core::identity::identity_object;
use cilium_idmig::core::labels::SecurityLabels;
use cilium_idmig::io::k8s::{CrdState, K8sTarget, ReadMode, RequestError};
use cilium_idmig::sandbox::{Fault, FaultConfig, Sandbox, SandboxConfig};

use crate::harness::http;

const IDS: &str = "/apis/cilium.io/v2/ciliumidentities";

fn labels(app: &str) -> SecurityLabels {
    [
        ("k8s:app".to_string(), app.to_string()),
        ("reserved:host".to_string(), String::new()),
    ]
    .into()
}

#[tokio::test(flavor = "multi_thread")]
async fn create_get_and_status_bodies() {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let url = sb.url();
    let body = identity_object(300, &labels("web")).to_string();
    let (code, _, text) = http(&url, "POST", IDS, Some(&body)).await;
    assert_eq!(code, 201, "{text}");
    let created: Value = serde_json::from_str(&text).unwrap();
    for field in ["uid", "resourceVersion", "creationTimestamp"] {
        assert!(
            created["metadata"][field].is_string(),
            "{field} in {created}"
        );
    }
    assert_eq!(created["security-labels"]["reserved:host"], "");

    let (code, _, text) = http(&url, "POST", IDS, Some(&body)).await;
    let status: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (code, &status["kind"], &status["reason"], &status["code"]),
        (409, &json!("Status"), &json!("AlreadyExists"), &json!(409))
    );
    assert_eq!(status["details"]["name"], "300");

    let (code, _, text) = http(&url, "GET", &format!("{IDS}/301"), None).await;
    let status: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((code, &status["reason"]), (404, &json!("NotFound")));

    // A label value the API server rejects, and a null security label (the v1 schema wants
    // strings; an API server before 1.20 answers 422, later ones prune the null).
    let mut bad = identity_object(302, &labels("web"));
    bad["metadata"]["labels"]["app"] = json!("not valid!");
    let (code, _, text) = http(&url, "POST", IDS, Some(&bad.to_string())).await;
    let status: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (code, &status["reason"]),
        (422, &json!("Invalid")),
        "{text}"
    );
    let mut null = identity_object(303, &labels("web"));
    null["security-labels"]["reserved:host"] = Value::Null;
    let (code, _, text) = http(&url, "POST", IDS, Some(&null.to_string())).await;
    assert_eq!(code, 422, "{text}");
    assert!(text.contains("must be of type string"), "{text}");
    assert_eq!(
        sb.objects().len(),
        1,
        "rejected creates leave nothing behind"
    );
    // resourceVersions only grow.
    let (_, _, t2) = http(
        &url,
        "POST",
        IDS,
        Some(&identity_object(304, &labels("db")).to_string()),
    )
    .await;
    let second: Value = serde_json::from_str(&t2).unwrap();
    let rv = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&second) > rv(&created));
}

#[tokio::test(flavor = "multi_thread")]
async fn list_pages_with_limit_and_continue_and_selects_by_label() {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    for i in 0..1203u32 {
        sb.seed_identity(1000 + i, &labels(if i % 3 == 0 { "web" } else { "db" }));
    }
    sb.seed_raw("not-a-number", json!({"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity", "metadata": {"name": "not-a-number"}, "security-labels": {}}));
    let mut names = Vec::new();
    let mut cont = String::new();
    let mut pages = 0;
    loop {
        let path = format!(
            "{IDS}?limit=500{}",
            if cont.is_empty() {
                String::new()
            } else {
                format!("&continue={cont}")
            }
        );
        let (code, _, text) = http(&sb.url(), "GET", &path, None).await;
        assert_eq!(code, 200);
        let v: Value = serde_json::from_str(&text).unwrap();
        pages += 1;
        names.extend(
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_string()),
        );
        match v["metadata"]["continue"].as_str() {
            Some(c) => {
                assert!(v["metadata"]["remainingItemCount"].as_u64().unwrap() > 0);
                cont = c.to_string();
            }
            None => break,
        }
    }
    assert_eq!((pages, names.len()), (3, 1204));
    let (_, _, text) = http(
        &sb.url(),
        "GET",
        &format!("{IDS}?labelSelector=app%3Dweb"),
        None,
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 401);
    let (_, _, text) = http(
        &sb.url(),
        "GET",
        &format!("{IDS}?labelSelector=app+in+(web,db)"),
        None,
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 1203);
    let (code, _, _) = http(&sb.url(), "GET", &format!("{IDS}?continue=zz"), None).await;
    assert_eq!(code, 400);

    // The product's lister reads all pages and sets aside names that are not ids; a read
    // from the cache (one response here) finds the same.
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    let snap = target
        .list_identities(ReadMode::Consistent, None)
        .await
        .unwrap();
    let cached = target.list_identities(ReadMode::Cache, None).await.unwrap();
    assert_eq!(cached.identities, snap.identities);
    assert_eq!(cached.other_names, snap.other_names);
    assert_eq!(snap.identities.len(), 1203);
    assert_eq!(snap.other_names, vec!["not-a-number".to_string()]);
    assert_eq!(
        snap.identities[&1000],
        cilium_idmig::core::labels::canonical_key(&labels("web"))
    );
    assert_eq!(snap.identities[&1000], "k8s:app=web;reserved:host=;");
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_streams_events_after_a_resource_version() {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    sb.seed_identity(300, &labels("before"));
    let (_, _, text) = http(&sb.url(), "GET", &format!("{IDS}?limit=1"), None).await;
    let rv = serde_json::from_str::<Value>(&text).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let addr = sb.url().trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(format!("GET {IDS}?watch=true&resourceVersion={rv}&labelSelector=app%3Dafter HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    sb.seed_identity(301, &labels("ignored"));
    sb.seed_identity(302, &labels("after"));
    let mut buf = Vec::new();
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&buf).contains("\"302\"") || n == 0 {
                break;
            }
        }
    })
    .await;
    assert!(
        got.is_ok(),
        "no watch event: {}",
        String::from_utf8_lossy(&buf)
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(text.contains("\"type\":\"ADDED\""), "{text}");
    assert!(
        !text.contains("\"300\"") && !text.contains("\"301\""),
        "only events after rv and matching the selector: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn crd_lifecycle_plain_404_until_established() {
    let sb = Sandbox::start(SandboxConfig {
        with_crd: false,
        crd_establish_delay: Duration::from_millis(500),
        ..Default::default()
    })
    .await
    .unwrap();
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    assert_eq!(target.crd_state().await.unwrap(), CrdState::Missing);
    let snap = target.list_identities(ReadMode::Cache, None).await.unwrap();
    assert!(!snap.crd_present);
    target.create_crd().await.unwrap();
    assert_eq!(
        target.crd_state().await.unwrap(),
        CrdState::Present { established: false }
    );
    let (code, headers, body) = http(&sb.url(), "GET", IDS, None).await;
    assert_eq!((code, body.trim()), (404, "404 page not found"));
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("text/plain"))
    );
    let err = target.get_identity_object(1).await.unwrap_err();
    assert!(
        matches!(&err, RequestError::Status { code: 404, reason, .. } if reason.is_empty()),
        "{err:?}"
    );
    target
        .wait_crd_established(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        target.crd_state().await.unwrap(),
        CrdState::Present { established: true }
    );
    target.create_identity(300, &labels("web")).await.unwrap();
    assert_eq!(
        target
            .get_identity_object(300)
            .await
            .unwrap()
            .map(|(_, l)| l),
        Some(labels("web"))
    );
    // Creating it again is harmless.
    target.create_crd().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn injects_429_500_drops_and_latency() {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let mut f = FaultConfig::default();
    f.queue.extend([
        Fault::TooManyRequests {
            retry_after_secs: 3,
        },
        Fault::Status(500),
        Fault::Drop,
        Fault::Delay(Duration::from_millis(300)),
    ]);
    sb.set_faults(f);
    let (code, headers, text) = http(&sb.url(), "GET", IDS, None).await;
    assert_eq!(code, 429);
    assert!(
        headers.iter().any(|(k, v)| k == "retry-after" && v == "3"),
        "{headers:?}"
    );
    assert!(text.contains("TooManyRequests"));
    let (code, _, _) = http(&sb.url(), "GET", IDS, None).await;
    assert_eq!(code, 500);
    let (code, _, body) = http(&sb.url(), "GET", IDS, None).await;
    assert_eq!((code, body.as_str()), (0, ""), "dropped without an answer");
    let start = std::time::Instant::now();
    let (code, _, _) = http(&sb.url(), "GET", IDS, None).await;
    assert_eq!(code, 200);
    assert!(start.elapsed() >= Duration::from_millis(300));
    // The product's client classifies them.
    let mut f = FaultConfig::default();
    f.queue.extend([
        Fault::TooManyRequests {
            retry_after_secs: 2,
        },
        Fault::Drop,
    ]);
    sb.set_faults(f);
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    let e = target.get_identity_object(1).await.unwrap_err();
    assert!(
        e.is_retryable() && e.retry_after() == Some(Duration::from_secs(2)),
        "{e:?}"
    );
    let e = target.get_identity_object(1).await.unwrap_err();
    assert!(matches!(e, RequestError::Transport(_)), "{e:?}");
    // Bearer tokens are enforced when configured.
    let sb = Sandbox::start(SandboxConfig {
        token: Some("s3cret".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let (code, _, text) = http(&sb.url(), "GET", IDS, None).await;
    assert_eq!(code, 401, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_preconditions_are_honoured_as_the_api_server_does() {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let url = sb.url();
    let body = identity_object(300, &labels("web")).to_string();
    let (code, _, text) = http(&url, "POST", IDS, Some(&body)).await;
    assert_eq!(code, 201, "{text}");
    let created: Value = serde_json::from_str(&text).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let delete = |uid: &str, rv: &str| {
        json!({"kind": "DeleteOptions", "apiVersion": "v1",
               "preconditions": {"uid": uid, "resourceVersion": rv}})
        .to_string()
    };
    let path = format!("{IDS}/300");
    // Another uid: 409 Conflict with a Status body naming both uids, in kube-apiserver's
    // words for a custom resource (the parity script holds them against a real one); the
    // object stays.
    let (code, _, text) = http(&url, "DELETE", &path, Some(&delete("other", &rv))).await;
    let status: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (code, &status["reason"]),
        (409, &json!("Conflict")),
        "{text}"
    );
    assert!(status["message"].as_str().unwrap().contains(&format!(
        "the UID in the precondition (other) does not match the UID in record ({uid})"
    )));
    assert_eq!(status["details"]["name"], "300");
    // An old resourceVersion: 409 too.
    let (code, _, text) = http(&url, "DELETE", &path, Some(&delete(&uid, "1"))).await;
    assert_eq!(code, 409, "{text}");
    assert!(
        text.contains("the ResourceVersion in the precondition (1) does not match"),
        "{text}"
    );
    assert_eq!(sb.objects().len(), 1);
    // Through the product's client: the same answers, classified.
    let target = K8sTarget::from_url(&url).unwrap();
    let wrong = cilium_idmig::io::k8s::ObjectRef {
        uid: "other".into(),
        resource_version: rv.clone(),
        ..Default::default()
    };
    let e = target.delete_identity(300, &wrong).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    let (found, _) = target.get_identity_object(300).await.unwrap().unwrap();
    assert_eq!(
        (found.uid.as_str(), found.resource_version.as_str()),
        (uid.as_str(), rv.as_str())
    );
    target.delete_identity(300, &found).await.unwrap();
    assert!(sb.objects().is_empty());
    // Gone: 404 NotFound.
    let e = target.delete_identity(300, &found).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

/// A sandbox holding `n` identities, serving reads as `reads` says.
async fn sandbox_with(n: u32, reads: cilium_idmig::sandbox::ReadModel) -> Sandbox {
    let sb = Sandbox::start(SandboxConfig {
        reads,
        ..Default::default()
    })
    .await
    .unwrap();
    for i in 0..n {
        sb.seed_identity(1000 + i, &labels(&format!("a{i}")));
    }
    sb
}

#[tokio::test(flavor = "multi_thread")]
async fn lists_read_the_cache_a_stream_or_quorum_pages_as_asked() {
    use cilium_idmig::sandbox::ReadModel;
    // A server without streaming lists (1.19 to 1.33 by default): the cache read is one
    // resourceVersion=0 response whatever the size; the refusal of the stream is remembered.
    let sb = sandbox_with(1203, ReadModel::default()).await;
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    let cached = target.list_identities(ReadMode::Cache, None).await.unwrap();
    assert_eq!(cached.identities.len(), 1203);
    assert_eq!(sb.request_count("LIST from cache"), 1);
    assert_eq!(sb.request_count("WATCH with initial events"), 0);
    target.list_identities(ReadMode::Cache, None).await.unwrap();
    assert_eq!(sb.request_count("LIST from cache"), 2);
    assert_eq!(
        sb.request_count("GET ciliumidentities"),
        3,
        "one refused stream, then two cache lists"
    );
    // A consistent read: quorum pages of 500.
    let listed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let quorum = target
        .list_identities(ReadMode::Consistent, Some(listed.clone()))
        .await
        .unwrap();
    assert_eq!(sb.request_count("LIST quorum"), 3);
    assert_eq!(quorum.identities, cached.identities);
    assert_eq!(listed.load(std::sync::atomic::Ordering::Relaxed), 1203);
    // A server with streaming lists: one watch, its initial events, and the bookmark.
    let sb = sandbox_with(
        1203,
        ReadModel {
            watch_list: true,
            ..Default::default()
        },
    )
    .await;
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    let streamed = target.list_identities(ReadMode::Cache, None).await.unwrap();
    assert_eq!(streamed.identities, cached.identities);
    assert_eq!(sb.request_count("WATCH with initial events"), 1);
    assert_eq!(
        sb.request_count("LIST from cache") + sb.request_count("LIST quorum"),
        0
    );
    assert!(!streamed.resource_version.is_empty());
    // The stream's contract: NotOlderThan, else Invalid.
    let (code, _, text) = http(
        &sb.url(),
        "GET",
        &format!("{IDS}?watch=1&sendInitialEvents=true"),
        None,
    )
    .await;
    assert_eq!(code, 422, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cache_read_cut_short_is_read_again() {
    let sb = sandbox_with(800, Default::default()).await;
    sb.set_faults(FaultConfig {
        queue: [Fault::Drop].into(),
        ..Default::default()
    });
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    let snap = target.list_identities(ReadMode::Cache, None).await.unwrap();
    assert_eq!(snap.identities.len(), 800);
}

/// Runs the real `kubectl` against the sandbox, with a discovery cache of its own.
async fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> crate::harness::Run {
    let dir = kubeconfig.parent().unwrap();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(dir.join("kube-cache"))
        .args(args)
        .env("HOME", dir)
        .output()
        .await
        .expect("kubectl (Debian package kubernetes-client; scripts/need test installs it)");
    crate::harness::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_gets_describes_selects_and_deletes() {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let ns = |app: &str| -> SecurityLabels {
        [
            ("k8s:app".to_string(), app.to_string()),
            (
                "k8s:io.kubernetes.pod.namespace".to_string(),
                "shop".to_string(),
            ),
        ]
        .into()
    };
    sb.seed_identity(300, &ns("a"));
    sb.seed_identity(301, &ns("b"));
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    sb.write_kubeconfig(&kc).unwrap();

    // The server's own table: the CRD's printer columns.
    let r = kubectl(&kc, &["get", "ciliumidentities"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let header = r.stdout.lines().next().unwrap_or("");
    for col in ["NAME", "NAMESPACE", "AGE"] {
        assert!(header.contains(col), "{}", r.stdout);
    }
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("300") && l.contains("shop")),
        "{}",
        r.stdout
    );
    assert!(
        !r.stderr.contains("couldn't get"),
        "discovery failed: {}",
        r.stderr
    );

    // The short name, one object, as YAML.
    let r = kubectl(&kc, &["get", "ciliumid", "301", "-o", "yaml"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("kind: CiliumIdentity"), "{}", r.stdout);
    assert!(r.stdout.contains("k8s:app: b"), "{}", r.stdout);

    let r = kubectl(&kc, &["describe", "ciliumidentity", "300"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("Name:") && r.stdout.contains("300"),
        "{}",
        r.stdout
    );

    // Label selectors reach the server.
    let r = kubectl(&kc, &["get", "ciliumid", "-l", "app=b", "-o", "name"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout.trim(),
        "ciliumidentity.cilium.io/301",
        "{}",
        r.stdout
    );

    // The CRD is an object kubectl can get, alone or in the list.
    let r = kubectl(&kc, &["get", "crd", "-o", "name"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout.trim(),
        "customresourcedefinition.apiextensions.k8s.io/ciliumidentities.cilium.io"
    );
    // kubectl validates a create from the OpenAPI document: it leaves fields to the
    // server, which refuses an unknown one (as a 1.27+ server does with Strict)...
    let manifest = dir.path().join("id.json");
    let with_extra = serde_json::json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
        "metadata": {"name": "302"},
        "security-labels": {"k8s:app": "c"}, "extra": 1,
    });
    std::fs::write(&manifest, with_extra.to_string()).unwrap();
    let file = manifest.display().to_string();
    let r = kubectl(&kc, &["create", "-f", &file]).await;
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("unknown field \"extra\""), "{}", r.stderr);
    assert!(!sb.objects().contains_key("302"));
    // ...with --validate=warn it is dropped with a warning...
    let r = kubectl(
        &kc,
        &["create", "--validate=warn", "--dry-run=server", "-f", &file],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("unknown field \"extra\""), "{}", r.stderr);
    assert!(!sb.objects().contains_key("302"));
    // ...and without validation, dropped silently.
    let r = kubectl(&kc, &["create", "--validate=false", "-f", &file]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("unknown field"), "{}", r.stderr);
    assert!(sb.objects()["302"].get("extra").is_none());
    // Several objects in one file (a `v1 List`), validated as kubectl validates a List:
    // created, with no --validate=false.
    let list = dir.path().join("list.json");
    let items = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
         "metadata": {"name": "310"}, "security-labels": {"k8s:app": "l1"}},
        {"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
         "metadata": {"name": "311"}, "security-labels": {"k8s:app": "l2"}},
    ]});
    std::fs::write(&list, items.to_string()).unwrap();
    let r = kubectl(&kc, &["create", "-f", &list.display().to_string()]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(sb.objects().contains_key("310") && sb.objects().contains_key("311"));
    // Labels, annotations and patches, as a real server takes them; a patch that changes
    // the security labels bumps the generation, one that breaks the schema is refused.
    for args in [
        &["label", "ciliumid", "302", "team=x"][..],
        &["annotate", "ciliumid", "302", "note=hi"],
        &[
            "patch",
            "ciliumid",
            "302",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/security-labels/k8s:tier","value":"db"}]"#,
        ],
        &[
            "patch",
            "ciliumid",
            "302",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"team":null}}}"#,
        ],
    ] {
        let r = kubectl(&kc, args).await;
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
    }
    let o = &sb.objects()["302"];
    assert_eq!(o["metadata"]["annotations"]["note"], "hi");
    assert!(o["metadata"].get("labels").is_none(), "{o}");
    assert_eq!(o["security-labels"]["k8s:tier"], "db");
    assert_eq!(o["metadata"]["generation"], 2);
    let r = kubectl(
        &kc,
        &[
            "patch",
            "ciliumid",
            "302",
            "--type=merge",
            "-p",
            r#"{"security-labels":null}"#,
        ],
    )
    .await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("security-labels: Required value"),
        "{}",
        r.stderr
    );
    assert_eq!(sb.objects()["302"]["security-labels"]["k8s:tier"], "db");

    // A server-side dry run deletes nothing; a real delete does.
    let r = kubectl(&kc, &["delete", "ciliumid", "300", "--dry-run=server"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("server dry run"), "{}", r.stdout);
    assert!(sb.objects().contains_key("300"));
    let r = kubectl(&kc, &["delete", "ciliumid", "300"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!sb.objects().contains_key("300"));

    // A missing object is kubectl's own NotFound message, from the Status body.
    let r = kubectl(&kc, &["get", "ciliumid", "300"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("NotFound") && r.stderr.contains("\"300\" not found"),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_continue_token_that_expires_mid_list_starts_the_list_over() {
    let sb = sandbox_with(1_500, Default::default()).await;
    // Slow pages, so the history can move on between the first page and the next.
    sb.set_faults(FaultConfig {
        latency: Duration::from_millis(300),
        ..Default::default()
    });
    let target = K8sTarget::from_url(&sb.url()).unwrap();
    let list =
        tokio::spawn(async move { target.list_identities(ReadMode::Consistent, None).await });
    while sb.request_count("GET ciliumidentities") < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first page is out: its continue token is now older than the history kept.
    sb.expire_watches();
    let snap = list.await.unwrap().unwrap();
    assert_eq!(snap.identities.len(), 1_500, "the whole list, once");
    assert!(
        sb.request_count("GET ciliumidentities") >= 5,
        "a 410 and a list started over: {} requests",
        sb.request_count("GET ciliumidentities")
    );
}

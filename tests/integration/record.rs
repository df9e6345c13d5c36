//! The decision log as the record: resuming a review (headless and in the TUI, after a quit
//! and after SIGKILL, with the cluster changed in between), and rolling back exactly what a
//! run created, against the real etcd and the sandbox.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use cilium_idmig::core::labels::{parse_label_key, to_security_labels};
use cilium_idmig::sandbox::{FaultConfig, SandboxConfig};

use crate::e2e::{World, log_records, seed_every_kind};
use crate::harness::{Tmux, bin, http};

const P: &str = "cilium/state/identities/v1";
const IDS: &str = "/apis/cilium.io/v2/ciliumidentities";

/// Appends TUI-style decision lines, as an operator's review leaves them.
fn write_decisions(path: &Path, lines: &[(&str, &str, &str, &str, Option<u32>)]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for (id, labels, kind, decision, target) in lines {
        let v = serde_json::json!({
            "ts": "2026-11-30T10:00:00Z", "operator": "alice@bastion", "id": id,
            "labels": labels, "kind": kind, "decision": decision, "target_id": target,
            "outcome": null, "error": null,
        });
        writeln!(f, "{v}").unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_resume_replays_recorded_decisions_and_lists_those_that_no_longer_fit() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let review = w.dir.path().join("review.jsonl");
    let c = "k8s:app=c;k8s:io.kubernetes.pod.namespace=shop;";
    let e = "k8s:app=e;reserved:host=;k8s:io.kubernetes.pod.namespace=shop;";
    write_decisions(
        &review,
        &[
            // The remap 302 goes to 4000, then to 4001, undone back to 4000.
            ("302", c, "remap", "edit (create 4000)", Some(4000)),
            ("302", c, "remap", "edit (create 4001)", Some(4001)),
            ("302", c, "remap", "undo (create 4000)", Some(4000)),
            // The duplicate 304 is skipped.
            ("304", e, "duplicate", "skip (skip -)", None),
            // A decision on labels that are no longer what the kvstore holds.
            ("301", "k8s:app=old;", "create", "skip (skip -)", None),
        ],
    );
    let log = w.path("apply.jsonl");
    let r = w
        .cli(&[
            "apply",
            "--yes",
            "--resume",
            &review.display().to_string(),
            "--decision-log",
            &log,
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("resumed 2 recorded decisions; 1 dropped"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("decision on 301 was dropped: its labels"),
        "{}",
        r.stdout
    );
    let state = w.state();
    assert!(state.contains_key("4000"), "the resumed edit: {state:?}");
    assert!(!state.contains_key("4001"), "the undone edit");
    assert!(!state.contains_key("304"), "the resumed skip");
    assert!(
        state.contains_key("301"),
        "the dropped decision's item takes its proposal"
    );
    // --plan and --resume together are refused before anything is read.
    let r = w
        .cli(&["apply", "--yes", "--plan", "x.json", "--resume", "y.jsonl"])
        .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_deletes_exactly_what_the_run_created() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    for i in 0..20u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 1000 + i),
                format!("k8s:app=n{i};").as_bytes(),
            )
            .await;
    }
    let before = w.sb.objects();
    let log = w.path("run.jsonl");
    let r = w.apply_accepting(&log).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let created: Vec<Value> = log_records(Path::new(&log))
        .into_iter()
        .filter(|r| r["outcome"] == "created")
        .collect();
    assert!(created.len() >= 20);
    assert!(
        created
            .iter()
            .all(|r| r["uid"].as_str().is_some_and(|u| !u.is_empty())),
        "uid recorded"
    );
    assert!(created.iter().all(|r| r["resource_version"].is_string()));
    // Meanwhile: 1000 deleted by hand, 1001 deleted and created again by someone else, and
    // 1002's labels changed by an update.
    let url = w.sb.url();
    let (code, _, _) = http(&url, "DELETE", &format!("{IDS}/1000"), None).await;
    assert_eq!(code, 200);
    let (code, _, _) = http(&url, "DELETE", &format!("{IDS}/1001"), None).await;
    assert_eq!(code, 200);
    w.sb.seed_identity(
        1001,
        &to_security_labels(&parse_label_key("k8s:app=n1;").unwrap()),
    );
    w.sb.seed_identity(
        1999,
        &to_security_labels(&parse_label_key("k8s:app=other;").unwrap()),
    );
    let mut changed = w.sb.objects()["1002"].clone();
    changed["security-labels"] = serde_json::json!({"k8s:app": "changed"});
    w.sb.seed_raw("1002", changed);

    // The plan changes nothing.
    let r = w.cli(&["rollback", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("already-gone 1000"), "{}", r.stdout);
    assert!(r.stdout.contains("keep         1001"), "{}", r.stdout);
    assert!(r.stdout.contains("created again"), "{}", r.stdout);
    assert!(r.stdout.contains("keep         1002"), "{}", r.stdout);
    assert!(r.stdout.contains("nothing was changed"), "{}", r.stdout);
    let n = w.sb.objects().len();
    // With --yes: the run's objects go; what was there before, or is someone else's, stays.
    let r = w.cli(&["rollback", "--decision-log", &log, "--yes"]).await;
    assert_eq!(
        r.code, 1,
        "kept objects make it exit 1: {}{}",
        r.stdout, r.stderr
    );
    assert!(r.stdout.contains("kept 2"), "{}", r.stdout);
    // Its progress counts as its plan counted, and each kept object is said once.
    assert!(
        r.stderr.contains("rolling back: ")
            && r.stderr.contains(" to delete, 1 already gone, 2 kept"),
        "a rollback's progress speaks of deletes: {}",
        r.stderr
    );
    let said = format!("{}{}", r.stdout, r.stderr);
    for id in ["1001", "1002"] {
        let lines = said
            .lines()
            .filter(|l| l.contains(id) && l.contains("kept"))
            .count();
        assert_eq!(lines, 1, "{id} said once as kept:\n{said}");
    }
    // Neither a log nor a run: both ways to name what to roll back are offered.
    let none = w.cli(&["rollback"]).await;
    assert_eq!(none.code, 2, "{}", none.stderr);
    assert!(
        none.stderr.contains("--decision-log") && none.stderr.contains("--run"),
        "{}",
        none.stderr
    );
    let after = w.sb.objects();
    assert!(after.len() < n);
    for (name, obj) in &before {
        assert_eq!(after.get(name), Some(obj), "pre-existing {name} untouched");
    }
    assert!(after.contains_key("1001") && after.contains_key("1002") && after.contains_key("1999"));
    for r in &created {
        let name = r["target_id"].to_string();
        if !["1001", "1002"].contains(&name.as_str()) {
            assert!(
                !after.contains_key(&name),
                "{name} was the run's and is deleted"
            );
        }
    }
    let records = log_records(Path::new(&log));
    let outcome = |name: u32, o: &str| {
        records
            .iter()
            .any(|r| r["target_id"] == name && r["outcome"] == o)
    };
    assert!(outcome(1000, "already-gone"));
    assert!(outcome(1001, "kept") && outcome(1002, "kept"));
    assert!(outcome(1003, "deleted"));
    // verify reads the rollback: rolled back, not missing.
    let r = w.cli(&["verify", "--decision-log", &log]).await;
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("rolled-back"), "{}", r.stdout);
    assert!(
        !r.stdout.lines().any(|l| l.starts_with("missing")),
        "{}",
        r.stdout
    );
    // A second rollback finds nothing more to delete and deletes nothing.
    let r = w.cli(&["rollback", "--decision-log", &log, "--yes"]).await;
    assert!(r.stdout.contains("deleted 0"), "{}", r.stdout);
    assert_eq!(w.sb.objects(), after);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_killed_midway_finishes_on_a_rerun() {
    let w = World::new(SandboxConfig::default()).await;
    for i in 0..400u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 2000 + i),
                format!("k8s:app=k{i};").as_bytes(),
            )
            .await;
    }
    let log = w.path("run.jsonl");
    let r = w.cli(&["apply", "--yes", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(w.sb.objects().len(), 400);
    w.sb.set_faults(FaultConfig {
        latency: Duration::from_millis(20),
        ..Default::default()
    });
    let kc = w.path("kubeconfig");
    let mut child = tokio::process::Command::new(bin())
        .current_dir(w.dir.path())
        .args([
            "rollback",
            "--yes",
            "--decision-log",
            &log,
            "--concurrency",
            "4",
        ])
        .args(["--kubeconfig", &kc])
        .spawn()
        .unwrap();
    // Kill it once some deletions have gone through.
    let started = std::time::Instant::now();
    while w.sb.objects().len() > 350 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let left = w.sb.objects().len();
    assert!(left > 0 && left < 400, "killed midway: {left} left");
    w.sb.set_faults(FaultConfig::default());
    let r = w.cli(&["rollback", "--yes", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        w.sb.objects().is_empty(),
        "everything the run created is gone"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_needs_its_own_role() {
    let w = World::new(SandboxConfig {
        denied: vec![("delete".into(), "ciliumidentities".into())],
        ..Default::default()
    })
    .await;
    let log = w.path("run.jsonl");
    std::fs::write(&log, "").unwrap();
    let r = w.cli(&["rollback", "--decision-log", &log, "--yes"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("assets/clusterrole-rollback.yaml"),
        "{}",
        r.stderr
    );
}

/// The TUI against the real etcd and the sandbox, in `dir`, under tmux.
fn tui(w: &World, name: &str, extra: &str) -> Tmux {
    let cmd = format!(
        "cd {} && {} tui --etcd-endpoints {} --kubeconfig {} {extra}; echo EXITED $?; sleep 600",
        w.dir.path().display(),
        bin(),
        w.etcd.endpoint,
        w.path("kubeconfig"),
    );
    Tmux::start(name, &cmd)
}

/// The undecided conflicts' ids in the order `n` steps through them.
fn decide_remap(t: &Tmux) -> String {
    for _ in 0..50 {
        let s = t.screen();
        if let Some(line) = s.lines().find(|l| l.contains("kvstore id"))
            && line.contains(" remap ")
            && line.contains("needs a decision")
        {
            return line
                .split("kvstore id ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .to_string();
        }
        t.keys(&["n"]);
    }
    panic!("no undecided remap:\n{}", t.screen());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_review_resumes_after_a_quit_and_after_sigkill() {
    let w = World::new(SandboxConfig::default()).await;
    // Three remaps: 300..302 are taken in Kubernetes by other labels.
    for i in 0..3u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 300 + i),
                format!("k8s:app=r{i};").as_bytes(),
            )
            .await;
        w.sb.seed_identity(
            300 + i,
            &to_security_labels(&parse_label_key(&format!("k8s:app=x{i};")).unwrap()),
        );
    }
    // First session: edit one remap to 5000, skip another, quit.
    let t = tui(&w, "resume1", "");
    t.wait_for("scanned 3 identities", 30);
    t.keys(&["3"]);
    let edited = decide_remap(&t);
    t.keys(&["e", "C-u", "5", "0", "0", "0", "Enter"]);
    t.wait_for("edit", 5);
    let skipped = decide_remap(&t);
    t.keys(&["s", "q"]);
    // Two decisions not committed: q asks first.
    t.wait_for("Quit with decisions not committed?", 5);
    t.keys(&["y"]);
    let s = t.wait_for("EXITED 0", 10);
    let log = s
        .lines()
        .find_map(|l| l.strip_prefix("decision log: "))
        .unwrap()
        .trim()
        .to_string();
    drop(t);
    // Meanwhile the skipped identity's labels change in the kvstore.
    w.etcd
        .put(&format!("{P}/id/{skipped}"), b"k8s:app=changed;")
        .await;
    // Names carry the start second: the next session's log must get another name.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Second session, no --resume: it offers the earlier log (never silently).
    let t = tui(&w, "resume2", "");
    let s = t.wait_for("Resume an earlier review?", 30);
    assert!(s.contains("2 decisions"), "{s}");
    t.keys(&["y"]);
    let s = t.wait_for("resumed 1 decisions", 30);
    assert!(s.contains("1 dropped"), "{s}");
    let s = t.wait_for("labels in the kvstore changed", 5);
    assert!(s.contains(&skipped), "{s}");
    t.keys(&["Space", "3"]);
    let s = t.wait_for("kvstore id", 5);
    let _ = s;
    // The resumed edit holds: the identity is decided at 5000.
    t.keys(&["2"]);
    let s = t.wait_for(&format!("{edited} "), 5);
    assert!(s.contains("→5000"), "{s}");
    // Kill it mid-review, without a chance to clean up.
    t.keys(&["3"]);
    let third = decide_remap(&t);
    t.keys(&["e", "C-u", "6", "0", "0", "0", "Enter"]);
    t.wait_for("edit", 5);
    let pid = t
        .cmd(&["display", "-p", "-t", "t", "#{pane_pid}"])
        .trim()
        .to_string();
    std::process::Command::new("pkill")
        .args(["-KILL", "-P", &pid, "-f", "cilium-idmig"])
        .status()
        .unwrap();
    t.wait_for("EXITED 137", 10);
    drop(t);
    let logs: Vec<String> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cilium-idmig-decisions-"))
        .collect();
    assert_eq!(logs.len(), 2, "{logs:?}");
    let newest = logs.iter().max().unwrap();
    assert_ne!(newest, &log);
    // Third session with --resume of both logs: the edit made before the kill is back.
    let resume = format!("--resume {log} --resume {newest}");
    let t = tui(&w, "resume3", &resume);
    t.wait_for("resumed 2 decisions", 30);
    t.keys(&["Space", "2"]);
    let s = t.wait_for(&format!("{third} "), 5);
    assert!(s.contains("→6000") && s.contains("→5000"), "{s}");
    t.keys(&["q"]);
    t.wait_for("EXITED 0", 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tui_reviews_a_rollback_then_deletes_on_yes() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let before = w.sb.objects();
    let log = w.path("run.jsonl");
    let r = w.apply_accepting(&log).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let made = w.sb.objects().len() - before.len();
    assert!(made >= 2);
    let t = tui(&w, "rollback", &format!("--rollback {log}"));
    let s = t.wait_for("to delete", 30);
    assert!(s.contains(&format!("{made} to delete")), "{s}");
    assert_eq!(
        w.sb.objects().len(),
        before.len() + made,
        "nothing deleted before yes"
    );
    t.keys(&["Enter"]);
    t.wait_for("Type yes", 5);
    t.keys(&["y", "e", "s", "Enter"]);
    let s = t.wait_for(&format!("deleted {made} · already gone 0 · kept 0"), 30);
    let _ = s;
    t.keys(&["q"]);
    let s = t.wait_for("EXITED 0", 10);
    assert!(s.contains(&format!("rollback: {made} deleted")), "{s}");
    assert_eq!(
        w.sb.objects(),
        before,
        "exactly what the run created is gone"
    );
    let records = log_records(Path::new(&log));
    assert_eq!(
        records.iter().filter(|r| r["outcome"] == "deleted").count(),
        made
    );
    assert!(
        records
            .iter()
            .any(|r| r["session"]["command"] == "rollback")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_whose_answers_were_lost_are_recorded_as_created_and_rolled_back() {
    let w = World::new(SandboxConfig::default()).await;
    for i in 0..20u32 {
        let key = format!("{P}/id/{}", 500 + i);
        w.etcd
            .put(&key, format!("k8s:app=lost-{i};").as_bytes())
            .await;
    }
    // Half the creates are carried out and their answers lost: the retry meets a 409.
    w.sb.set_faults(FaultConfig {
        p_lost_response: 0.5,
        writes_only: true,
        ..Default::default()
    });
    let log = w.path("lost.jsonl");
    let r = w.cli(&["apply", "--yes", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    w.sb.set_faults(FaultConfig::default());
    assert!(
        w.sb.request_count("POST ciliumidentities") > 25,
        "answers were lost and retried"
    );
    let records = log_records(Path::new(&log));
    let run = records
        .iter()
        .find_map(|r| r["session"]["run"].as_str())
        .expect("the session line names the run")
        .to_string();
    let created: Vec<&Value> = records
        .iter()
        .filter(|r| r["outcome"] == "created")
        .collect();
    assert_eq!(
        created.len(),
        20,
        "every create is ours, lost answers included"
    );
    assert!(
        created
            .iter()
            .all(|r| r["uid"].as_str().is_some_and(|u| !u.is_empty()))
    );
    for (name, o) in w.sb.objects() {
        assert_eq!(
            o["metadata"]["annotations"]["cilium-idmig.io/run"], run,
            "{name} names its run"
        );
    }
    let r = w.cli(&["rollback", "--yes", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(w.sb.objects().is_empty(), "all 20 rolled back");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_409_reads_what_is_there_and_never_overwrites() {
    use cilium_idmig::apply::executor::{self, ApplyOptions, StopFlag, Watchers};
    use cilium_idmig::core::outcome::Outcome;
    use cilium_idmig::core::planner::{DecidedBy, Kind, Op, OpKind};
    let w = World::new(SandboxConfig::default()).await;
    let labels = |k: &str| to_security_labels(&parse_label_key(k).unwrap());
    // Taken by other labels; by the same labels (another writer); by the same labels and
    // this very run (a create of ours whose answer was lost).
    w.sb.seed_identity(600, &labels("k8s:app=other;"));
    w.sb.seed_identity(601, &labels("k8s:app=same;"));
    let mut ours = cilium_idmig::core::identity::identity_object(602, &labels("k8s:app=ours;"));
    ours["metadata"]["annotations"] =
        serde_json::json!({"cilium-idmig.io/run": cilium_idmig::io::decision_log::run_id()});
    w.sb.seed_raw("602", ours);
    let op = |id: u32, key: &str| Op {
        id: id.to_string(),
        label_key: key.into(),
        kind: Kind::Create,
        op: OpKind::Create,
        target_id: Some(id),
        decided_by: DecidedBy::Rule,
        expect: None,
        reason: None,
    };
    let ops = vec![
        op(600, "k8s:app=mine;"),
        op(601, "k8s:app=same;"),
        op(602, "k8s:app=ours;"),
    ];
    let target = cilium_idmig::io::k8s::K8sTarget::from_url(&w.sb.url()).unwrap();
    let before = w.sb.objects();
    let report = executor::apply(
        &target,
        ops,
        false,
        &ApplyOptions::default(),
        None,
        Watchers::default(),
        StopFlag::default(),
    )
    .await
    .unwrap();
    let outcome = |id: u32| {
        report
            .results
            .iter()
            .find(|r| r.target_id == Some(id))
            .unwrap()
            .clone()
    };
    assert_eq!(outcome(600).outcome, Outcome::Conflict);
    assert_eq!(outcome(600).existing.as_deref(), Some("k8s:app=other;"));
    assert_eq!(outcome(601).outcome, Outcome::AlreadyExisted);
    assert_eq!(outcome(602).outcome, Outcome::Created);
    assert_eq!(
        outcome(602).uid.as_deref(),
        before["602"]["metadata"]["uid"].as_str()
    );
    assert_eq!(w.sb.objects(), before, "nothing overwritten");
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_keeps_identities_that_live_endpoints_use_unless_told() {
    let w = World::new(SandboxConfig::default()).await;
    for (id, app) in [(700, "web"), (701, "api"), (702, "gone")] {
        let key = format!("{P}/id/{id}");
        w.etcd.put(&key, format!("k8s:app={app};").as_bytes()).await;
    }
    let log = w.path("run.jsonl");
    let r = w.cli(&["apply", "--yes", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // CRD-mode agents use two of them: 700 by many pods (more than one page of the list).
    for i in 0..600 {
        w.sb.add_endpoint("shop", &format!("web-{i:03}"), 700);
    }
    w.sb.add_endpoint("pay", "api-0", 701);
    let review = w.cli(&["rollback", "--decision-log", &log]).await;
    assert_eq!(review.code, 0, "{}", review.stderr);
    assert!(
        review
            .stdout
            .contains("in use by 600 endpoint(s) in shop/web-000, shop/web-001")
            && review.stdout.contains("and 595 more (namespaces shop)")
            && review
                .stdout
                .contains("in use by 1 endpoint(s) in pay/api-0"),
        "{}",
        review.stdout
    );
    let r = w.cli(&["rollback", "--yes", "--decision-log", &log]).await;
    assert_eq!(r.code, 1, "two were kept: {}", r.stdout);
    let left: Vec<String> = w.sb.objects().into_keys().collect();
    assert_eq!(left, ["700", "701"]);
    let r = w
        .cli(&[
            "rollback",
            "--yes",
            "--include-in-use",
            "--decision-log",
            &log,
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(w.sb.objects().is_empty());

    // Without the right to list endpoints, rollback says so before it reads anything.
    let denied = World::new(SandboxConfig {
        denied: vec![("list".into(), "ciliumendpoints".into())],
        ..SandboxConfig::default()
    })
    .await;
    let r = denied.cli(&["rollback", "--decision-log", &log]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("ciliumendpoints"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_log_is_lost_is_rolled_back_by_its_annotation() {
    let w = World::new(SandboxConfig::default()).await;
    let put = |id: u32| {
        let key = format!("{P}/id/{id}");
        let etcd = &w.etcd;
        async move { etcd.put(&key, format!("k8s:app=r{id};").as_bytes()).await }
    };
    for id in 800..803 {
        put(id).await;
    }
    let first = w.path("first.jsonl");
    assert_eq!(
        w.cli(&["apply", "--yes", "--decision-log", &first])
            .await
            .code,
        0
    );
    for id in 803..805 {
        put(id).await;
    }
    let second = w.path("second.jsonl");
    assert_eq!(
        w.cli(&["apply", "--yes", "--decision-log", &second])
            .await
            .code,
        0
    );
    // Someone else's object, without the annotation.
    w.sb.seed_identity(
        900,
        &to_security_labels(&parse_label_key("k8s:app=x;").unwrap()),
    );
    let run = log_records(Path::new(&first))
        .iter()
        .find_map(|r| r["session"]["run"].as_str().map(str::to_string))
        .unwrap();
    std::fs::remove_file(&first).unwrap();
    let review = w.cli(&["rollback", "--run", &run]).await;
    assert_eq!(review.code, 0, "{}", review.stderr);
    assert!(review.stdout.contains("3 to delete"), "{}", review.stdout);
    let r = w.cli(&["rollback", "--run", &run, "--yes"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let left: Vec<String> = w.sb.objects().into_keys().collect();
    assert_eq!(left, ["803", "804", "900"], "only the lost run's objects");
    // A run no object carries (a typo) is said, not a silent success.
    let r = w.cli(&["rollback", "--run", "no-such-run"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("no CiliumIdentity carries the annotation cilium-idmig.io/run=no-such-run"),
        "{}",
        r.stderr
    );
    assert_eq!(w.sb.objects().len(), 3);
}

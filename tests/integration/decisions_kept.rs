//! No decision of the operator is lost: a run whose decisions write nothing keeps its log,
//! every command reads every log it can be given (decisions without writes, a run stopped
//! before any write, a torn last line, an empty file), and a log named that does not exist
//! is an error naming it. The real binary against a real etcd and the sandbox API server.

use std::path::Path;

use serde_json::Value;

use cilium_idmig::core::labels::{parse_label_key, to_security_labels};
use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::{World, log_records};
use crate::harness::run;
use crate::sync::Sync;

const P: &str = "cilium/state/identities/v1";
const A: &str = "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;";
const B: &str = "k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;";
const C: &str = "k8s:app=c;k8s:io.kubernetes.pod.namespace=shop;";
const D: &str = "k8s:app=d;k8s:io.kubernetes.pod.namespace=shop;";

/// The plan at `path` with `ids` set to skip, decided.
fn skip_in_plan(path: &str, ids: &[&str]) {
    let mut plan: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for item in plan["items"].as_array_mut().unwrap() {
        if ids.contains(&item["id"].as_str().unwrap()) {
            item["action"] = "skip".into();
            item["decided"] = true.into();
        }
    }
    std::fs::write(path, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
}

/// The operator's decisions in a log: (id, action) of each line decided by the operator.
fn operator_lines(path: &str) -> Vec<(String, String)> {
    log_records(Path::new(path))
        .into_iter()
        .filter(|r| r["decided_by"] == "operator")
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["action"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_skip_that_writes_nothing_is_recorded_and_every_command_reads_its_log() {
    let w = World::new(SandboxConfig::default()).await;
    // 1. 1700 and 1702 migrated.
    w.etcd.put(&format!("{P}/id/1700"), A.as_bytes()).await;
    w.etcd.put(&format!("{P}/id/1702"), B.as_bytes()).await;
    let d1 = w.path("d1.jsonl");
    let r = w.cli(&["apply", "--yes", "--decision-log", &d1]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // 2. 1701 appears in the kvstore, its id taken in Kubernetes by other labels (a remap);
    // 1703 too, a plain create.
    w.etcd.put(&format!("{P}/id/1701"), C.as_bytes()).await;
    w.etcd.put(&format!("{P}/id/1703"), D.as_bytes()).await;
    let squatter = to_security_labels(&parse_label_key("k8s:app=squatter;").unwrap());
    w.sb.seed_identity(1701, &squatter);
    // 3. Both skipped in the plan: nothing to write, and the skips are the record.
    let plan = w.path("plan.json");
    let r = w.cli(&["plan", "--output", &plan]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    skip_in_plan(&plan, &["1701", "1703"]);
    let skip = w.path("skip.jsonl");
    let r = w
        .cli(&["apply", "--plan", &plan, "--yes", "--decision-log", &skip])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(&format!(
            "decision log: {skip} (it records the decisions; nothing needed writing"
        )),
        "{}",
        r.stdout
    );
    let mut skips = operator_lines(&skip);
    skips.dedup();
    assert_eq!(
        skips,
        [
            ("1701".to_string(), "skip".to_string()),
            ("1703".to_string(), "skip".to_string())
        ]
    );
    let objects = w.sb.objects();
    assert!(!objects.contains_key("1703"), "a skip writes nothing");
    // 4. Every command reads it: log, verify, an apply and a sync resuming it.
    let r = run(w.dir.path(), &["log", &skip]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("1701") && r.stdout.contains("1703"),
        "{}",
        r.stdout
    );
    let r = w
        .cli(&["verify", "--decision-log", &d1, "--decision-log", &skip])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // The audit reads the skips as decided, not as findings, whichever log holds them.
    let r = w
        .cli(&["audit", "--decision-log", &d1, "--decision-log", &skip])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("skipped by decision: kvstore 1701"),
        "{}",
        r.stdout
    );
    let again = w.path("again.jsonl");
    let r = w
        .cli(&[
            "apply",
            "--yes",
            "--accept-proposals",
            "--resume",
            &d1,
            "--resume",
            &skip,
            "--decision-log",
            &again,
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        w.sb.objects(),
        objects,
        "the skips resumed: nothing created"
    );
    // A hand-made resume file that decides 1703 twice: the last stands, and it is said.
    let twice = w.path("twice.jsonl");
    std::fs::write(
        &twice,
        file_line("1703", D, "create", Some(1703)) + &file_line("1703", D, "skip", None),
    )
    .unwrap();
    let r = w
        .cli(&[
            "apply",
            "--yes",
            "--resume",
            &skip,
            "--resume",
            &twice,
            "--decision-log",
            &w.path("t.jsonl"),
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(
            "the logs decide 1 kvstore id more than once; the last decision on each stands: 1703"
        ),
        "{}",
        r.stdout
    );
    assert_eq!(
        w.sb.objects(),
        objects,
        "the last decision, the skip, stands"
    );
    let mut s = Sync::start_with_log(
        &w,
        "sync.jsonl",
        &[
            "--resume",
            &d1,
            "--resume",
            &skip,
            "--until-cutover",
            "--cutover-grace",
            "1s",
        ],
    );
    s.ends_at_cutover(60, 20).await;
    assert_eq!(
        w.sb.objects(),
        objects,
        "sync created nothing the operator skipped"
    );
    // 5. A plan of nothing but skips keeps every one of them.
    let plan2 = w.path("plan2.json");
    let r = w.cli(&["plan", "--output", &plan2]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    skip_in_plan(&plan2, &["1700", "1701", "1702", "1703"]);
    let all = w.path("all-skips.jsonl");
    let r = w
        .cli(&["apply", "--plan", &plan2, "--yes", "--decision-log", &all])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let mut ids: Vec<String> = operator_lines(&all)
        .into_iter()
        .filter(|(_, a)| a == "skip")
        .map(|(id, _)| id)
        .collect();
    ids.dedup();
    assert_eq!(ids, ["1700", "1701", "1702", "1703"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_command_reads_every_log_and_a_missing_one_is_named() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/1700"), A.as_bytes()).await;
    let d1 = w.path("d1.jsonl");
    let r = w.cli(&["apply", "--yes", "--decision-log", &d1]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let whole = std::fs::read_to_string(&d1).unwrap();
    // An empty file, a log of a run stopped before any write (its session line alone), and
    // a log whose last line is torn.
    let empty = w.path("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let session_only = w.path("session.jsonl");
    std::fs::write(
        &session_only,
        format!("{}\n", whole.lines().next().unwrap()),
    )
    .unwrap();
    let torn = w.path("torn.jsonl");
    std::fs::write(&torn, format!("{whole}{{\"ts\":\"2026-12-04T10:")).unwrap();
    for log in [&empty, &session_only, &torn] {
        let r = run(w.dir.path(), &["log", log]).await;
        assert_eq!(r.code, 0, "log {log}: {}{}", r.stdout, r.stderr);
        let r = w.cli(&["verify", "--decision-log", log]).await;
        assert_eq!(r.code, 0, "verify {log}: {}{}", r.stdout, r.stderr);
        let out = w.path("out.jsonl");
        let r = w
            .cli(&["apply", "--yes", "--resume", log, "--decision-log", &out])
            .await;
        assert_eq!(r.code, 0, "apply --resume {log}: {}{}", r.stdout, r.stderr);
        let r = w.cli(&["rollback", "--decision-log", log]).await;
        assert_eq!(r.code, 0, "rollback {log}: {}{}", r.stdout, r.stderr);
    }
    // A log named that does not exist: an error naming it, exit 2, for every reader.
    let missing = w.path("no-such-log.jsonl");
    for args in [
        vec!["apply", "--yes", "--resume", &missing],
        vec!["verify", "--decision-log", &missing],
    ] {
        let r = w.cli(&args).await;
        assert_eq!(r.code, 2, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains("no-such-log.jsonl"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = run(w.dir.path(), &["log", &missing]).await;
    assert_eq!(r.code, 2, "log: {}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("no-such-log.jsonl"), "log: {}", r.stderr);
    let mut s = Sync::start_with_log(&w, "sync.jsonl", &["--resume", &missing]);
    let (code, text) = s.exits_within(20).await;
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("no-such-log.jsonl"), "{text}");
}

/// A decisions file line: `action` on `id` by the operator, at `ts`.
fn file_line(id: &str, labels: &str, action: &str, target: Option<u32>) -> String {
    let ts = jiff::Timestamp::now().to_string();
    serde_json::json!({
        "ts": ts, "operator": "alice@bastion", "id": id, "labels": labels, "kind": "remap",
        "decision": format!("{action} (operator)"), "decided_by": "operator",
        "action": action, "target_id": target,
    })
    .to_string()
        + "\n"
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_logs_what_its_decisions_file_decides_and_undoes_before_acting() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    // A kvstore-mode node: no cutover while the test runs.
    w.etcd.put(&format!("{P}/value/{A}/10.0.0.1"), b"300").await;
    // 302 is a remap (its id taken by other labels); 303 a plain create.
    let squatter = to_security_labels(&parse_label_key("k8s:app=squatter;").unwrap());
    w.sb.seed_identity(302, &squatter);
    w.etcd.put(&format!("{P}/id/302"), C.as_bytes()).await;
    w.etcd.put(&format!("{P}/id/303"), D.as_bytes()).await;
    let file = w.path("decisions.jsonl");
    std::fs::write(
        &file,
        file_line("302", C, "skip", None) + &file_line("303", D, "skip", None),
    )
    .unwrap();
    let s = Sync::start_with_log(&w, "sync.jsonl", &["--decisions", &file]);
    s.wait_for_line("sync: ", 30).await;
    let log = w.path("sync.jsonl");
    let lines = operator_lines(&log);
    assert!(
        lines.contains(&("302".into(), "skip".into()))
            && lines.contains(&("303".into(), "skip".into())),
        "the file's decisions are logged before sync acts on them: {lines:?}"
    );
    assert!(!w.sb.objects().contains_key("303"), "303 skipped");
    // 303's line taken out of the file: an undo, logged, and 303 is created as proposed.
    std::fs::write(&file, file_line("302", C, "skip", None)).unwrap();
    s.wait_for_line("1 undo logged and carried to sync", 30)
        .await;
    crate::sync::wait_for(20, "303 created", || w.sb.objects().get("303").cloned()).await;
    let lines = operator_lines(&log);
    assert!(
        lines.contains(&("303".into(), "undecided".into())),
        "{lines:?}"
    );
    let (code, text) = s.stop().await;
    assert!(code == 0 || code == 1, "{text}");
    // Stopped without --until-cutover: what is left is said all the same.
    assert!(
        text.contains("cutover not reached: 1 kvstore-mode node, 0 pending decisions"),
        "{text}"
    );
    // The log alone carries it all: verify reads the skip as decided, and a sync restarted
    // on it without the file keeps 302 skipped.
    let r = w.cli(&["verify", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("1 skipped by decision"), "{}", r.stdout);
    let before = w.sb.objects();
    let s = Sync::start_with_log(&w, "sync.jsonl", &[]);
    s.wait_for_line("sync: ", 30).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let (_, text) = s.stop().await;
    assert_eq!(w.sb.objects(), before, "{text}");
    let r = run(w.dir.path(), &["log", "--decisions-only", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let ids: Vec<String> = r
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(String::from))
        .collect();
    assert_eq!(
        ids,
        ["302"],
        "the decisions in force, each once: {}",
        r.stdout
    );
}

/// What the operator does to one plan item by hand.
#[derive(Debug, Clone, Copy)]
enum Edit {
    Leave,
    /// `"decided": true` on the proposal.
    Decide,
    Skip,
    /// Create at its own id.
    CreateOwn,
    /// Create at 256 + k.
    CreateAt(u32),
}

fn edits() -> impl proptest::strategy::Strategy<Value = Vec<Edit>> {
    use proptest::prelude::*;
    let edit = prop_oneof![
        2 => Just(Edit::Leave),
        3 => Just(Edit::Decide),
        3 => Just(Edit::Skip),
        1 => Just(Edit::CreateOwn),
        1 => (0u32..6).prop_map(Edit::CreateAt),
    ];
    proptest::collection::vec(edit, 6)
}

/// A plan of six identities (a plain create, an already migrated one, two remaps, a
/// duplicate, a reuse) edited by hand, applied through the same path as `apply --plan`: a
/// refused plan logs no decision; an applied one logs every decision the operator made,
/// written or not, and replays to exactly those; every object created has its decision
/// line before its outcome; the log is kept whenever it holds a decision.
#[test]
fn a_hand_edited_plan_applied_logs_exactly_the_operators_decisions() {
    use cilium_idmig::app::flows::{self, ApplySpec};
    use cilium_idmig::apply::executor::{StopFlag, Watchers};
    use cilium_idmig::core::kvstore::{KvSnapshot, MasterEntry, SourceInfo};
    use cilium_idmig::core::planner::resume::{LoggedDecision, replay};
    use cilium_idmig::core::planner::{Action, DecidedBy};
    use cilium_idmig::core::range::ClusterScope;
    use cilium_idmig::io::decision_log::{DecisionLog, read};
    use cilium_idmig::io::k8s::K8sTarget;
    use cilium_idmig::io::kv_source::KvSource;
    use cilium_idmig::sandbox::Sandbox;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    // How many edited plans were applied and how many refused: both must be tried.
    let (applied, refused) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let labels = |n: u32| format!("k8s:app=p{n};k8s:io.kubernetes.pod.namespace=shop;");
    let sl = |k: &str| to_security_labels(&parse_label_key(k).unwrap());
    runner
        .run(&edits(), |edits| {
            rt.block_on(async {
                let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
                // 300 plain, 301 migrated, 302 and 303 remaps, 304 a duplicate (at 904), 305
                // a reuse (its id taken, its labels at 905).
                sb.seed_identity(301, &sl(&labels(1)));
                sb.seed_identity(302, &sl("k8s:app=squatter2;"));
                sb.seed_identity(303, &sl("k8s:app=squatter3;"));
                sb.seed_identity(904, &sl(&labels(4)));
                sb.seed_identity(305, &sl("k8s:app=squatter5;"));
                sb.seed_identity(905, &sl(&labels(5)));
                let seeded = sb.objects();
                let masters = (0..6)
                    .map(|n| MasterEntry::new((300 + n).to_string(), labels(n)))
                    .collect();
                let kv = KvSource::Memory(KvSnapshot {
                    source: SourceInfo {
                        prefix: "cilium/state/identities/v1".into(),
                        ..Default::default()
                    },
                    masters,
                    node_counts: Default::default(),
                });
                let target = K8sTarget::from_url(&sb.url()).unwrap();
                let scope = ClusterScope::new(0, Default::default()).unwrap();
                let scan = flows::scan(&kv, &target, scope.range).await.unwrap();
                let live = scan.items.clone();
                let mut plan = flows::plan_file(scan, &target, scope);
                for (item, edit) in plan.items.iter_mut().zip(&edits) {
                    let own = item.numeric_id().unwrap();
                    match edit {
                        Edit::Leave => {}
                        Edit::Decide => item.decided = true,
                        Edit::Skip => item.action = Action::Skip,
                        Edit::CreateOwn => {
                            item.action = Action::Create;
                            item.target_id = Some(own);
                        }
                        Edit::CreateAt(k) => {
                            item.action = Action::Create;
                            item.target_id = Some(256 + k);
                        }
                    }
                    if !matches!(edit, Edit::Leave) {
                        item.decided = true;
                    }
                }
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("plan.jsonl");
                let log = DecisionLog::open(&path).unwrap();
                let spec = ApplySpec {
                    plan: Some(plan.clone()),
                    resume: Vec::new(),
                    accept_proposals: false,
                    options: Default::default(),
                };
                let watchers = Watchers {
                    events: None,
                    progress: None,
                };
                let run = flows::apply(
                    &kv,
                    &target,
                    scope,
                    &spec,
                    &log,
                    watchers,
                    StopFlag::default(),
                )
                .await;
                let records = read(&path).unwrap().records;
                let Ok(run) = run else {
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert!(
                        records.is_empty(),
                        "a refused plan logs nothing: {records:?}"
                    );
                    assert_eq!(sb.objects(), seeded, "a refused plan writes nothing");
                    return;
                };
                assert!(run.report.succeeded(), "{:?}", run.report);
                applied.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // The operator's decisions, as the plan states them: a skip has no target, and
                // a create where Kubernetes already holds the labels is that id served.
                let expected: std::collections::BTreeMap<String, LoggedDecision> = plan
                    .items
                    .iter()
                    .zip(&live)
                    .filter(|(p, l)| DecidedBy::of(p, l, false) == DecidedBy::Operator)
                    .map(|(p, _)| {
                        let target_id = p.target_id.filter(|_| p.action != Action::Skip);
                        let served = target_id.is_some_and(|t| {
                            seeded.get(&t.to_string()).is_some_and(|o| {
                                cilium_idmig::core::identity::parse_identity(o)
                                    .unwrap()
                                    .labels
                                    == sl(&p.labels)
                            })
                        });
                        let action = match p.action {
                            Action::Create if served => Action::None,
                            a => a,
                        };
                        let d = LoggedDecision {
                            id: p.id.clone(),
                            labels: p.labels.clone(),
                            action,
                            target_id,
                        };
                        (p.id.clone(), d)
                    })
                    .collect();
                let replayed = replay(records.iter().filter_map(|r| r.step()));
                assert_eq!(replayed, expected, "edits {edits:?}");
                // Every object created has its decision line, before its outcome.
                for (name, _) in sb
                    .objects()
                    .iter()
                    .filter(|(n, _)| !seeded.contains_key(*n))
                {
                    let t: u32 = name.parse().unwrap();
                    let decided = records
                        .iter()
                        .position(|r| r.target_id == Some(t) && r.outcome.is_none());
                    let created = records.iter().position(|r| {
                        r.target_id == Some(t)
                            && r.outcome == Some(cilium_idmig::core::outcome::Outcome::Created)
                    });
                    assert!(
                        matches!((decided, created), (Some(d), Some(c)) if d < c),
                        "object {t}: decision line {decided:?}, outcome line {created:?}"
                    );
                }
                // Kept whenever it holds a decision; discarded only when it holds none.
                let discarded = log.discard_if_nothing_decided();
                assert_eq!(
                    discarded,
                    expected.is_empty() && !records.iter().any(|r| r.is_decision())
                );
            });
            Ok(())
        })
        .unwrap();
    let (applied, refused) = (applied.into_inner(), refused.into_inner());
    assert!(
        applied >= 4 && refused >= 4,
        "{applied} applied, {refused} refused"
    );
}

/// `log FILE | head -1`: the reader has what it wanted; no error, exit 0.
#[tokio::test(flavor = "multi_thread")]
async fn a_log_read_into_a_pipe_closed_early_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl");
    let line = serde_json::json!({
        "ts": "2026-12-04T10:00:00Z", "operator": "alice@bastion", "id": "300",
        "labels": A, "kind": "create", "decision": "create (proposal)",
        "decided_by": "proposal", "action": "create", "target_id": 300,
    })
    .to_string();
    // Larger than a pipe holds, so the write meets the closed pipe.
    std::fs::write(&path, format!("{line}\n").repeat(20_000)).unwrap();
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(r#"set -o pipefail; "$0" log "$1" | head -1 >/dev/null"#)
        .arg(crate::harness::bin())
        .arg(&path)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

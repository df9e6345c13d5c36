//! The real binary's TUI in `demo` mode under tmux: review conflicts, commit by typing yes,
//! then check the sandbox's objects, the decision log, and that `q` restores the terminal.

use serde_json::Value;

use crate::harness::{Tmux, bin, free_port, http};

/// Steps with `n` until the conflict shown is of `kind` and undecided; returns its kvstore id.
fn find_conflict(t: &Tmux, kind: &str) -> String {
    for _ in 0..400 {
        let s = t.screen();
        if let Some(line) = s.lines().find(|l| l.contains("kvstore id"))
            && line.contains(&format!(" {kind} "))
            && line.contains("needs a decision")
        {
            let id = line
                .split("kvstore id ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            return id.to_string();
        }
        t.keys(&["n"]);
    }
    panic!("no undecided {kind} conflict found:\n{}", t.screen());
}

#[tokio::test(flavor = "multi_thread")]
async fn review_and_commit_in_the_demo_under_tmux() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.jsonl");
    let port = free_port();
    let cmd = format!(
        "cd {} && {} demo --identities 300 --seed 5 --port {port} --decision-log {}; echo EXITED $?; sleep 600",
        dir.path().display(),
        bin(),
        log.display()
    );
    let t = Tmux::start("tui", &cmd);
    t.wait_for("scanned 300 identities", 30);
    assert_eq!(
        t.alternate_on(),
        "1",
        "the TUI runs on the alternate screen"
    );
    t.keys(&["3"]);
    let accepted = find_conflict(&t, "remap");
    t.keys(&["a"]);
    let edited = find_conflict(&t, "remap");
    t.keys(&[
        "e", "BSpace", "BSpace", "BSpace", "BSpace", "BSpace", "6", "0", "0", "0", "0", "Enter",
    ]);
    t.wait_for("edit", 5);
    let skipped = find_conflict(&t, "duplicate");
    t.keys(&["s", "A"]);
    t.wait_for("Accept all remaining proposals?", 5);
    t.keys(&["y", "4", "Enter"]);
    t.wait_for("Type yes", 5);
    t.keys(&["y", "e", "s", "Enter"]);
    let done = t.wait_for("verified: ", 60);
    assert!(done.contains("0 failed"), "{done}");
    // The skip was the operator's: verification passes, naming it as skipped.
    assert!(
        done.contains("verified: ") && done.contains("1 skipped by decision"),
        "{done}"
    );

    // The sandbox holds what was decided.
    let base = format!("http://127.0.0.1:{port}");
    let get = |name: String| {
        let base = base.clone();
        async move {
            let (code, _, body) = http(
                &base,
                "GET",
                &format!("/apis/cilium.io/v2/ciliumidentities/{name}"),
                None,
            )
            .await;
            (
                code,
                serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
            )
        }
    };
    let (code, edited_obj) = get("60000".into()).await;
    assert_eq!(code, 200, "the edited remap was created at 60000");
    let records: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let labels_of = |id: &str| {
        records.iter().find(|r| r["id"] == id).unwrap()["labels"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let edited_labels = labels_of(&edited);
    let sec = edited_obj["security-labels"].as_object().unwrap();
    for part in edited_labels.trim_end_matches(';').split(';') {
        let (k, v) = part.split_once('=').unwrap();
        assert_eq!(sec[k], v, "{part}");
    }
    let (code, _) = get(skipped.clone()).await;
    assert_eq!(code, 404, "the skipped duplicate {skipped} was not created");
    let accepted_outcome = records
        .iter()
        .rev()
        .find(|r| r["id"] == accepted.as_str() && r["outcome"] == "created")
        .unwrap_or_else(|| panic!("no created outcome for {accepted}"));
    let (code, _) = get(accepted_outcome["target_id"].to_string()).await;
    assert_eq!(code, 200);
    // Every decision was logged as it was made, then the outcomes.
    let decision = |id: &str, word: &str| {
        records.iter().any(|r| {
            r["id"] == id
                && r["outcome"].is_null()
                && r["decision"].as_str().unwrap().starts_with(word)
        })
    };
    assert!(decision(&accepted, "accept"));
    assert!(decision(&edited, "edit (create 60000)"));
    assert!(decision(&skipped, "skip"));
    assert!(
        records
            .iter()
            .any(|r| r["id"] == skipped.as_str() && r["outcome"] == "skipped")
    );

    // q leaves a restored terminal.
    t.keys(&["q"]);
    let s = t.wait_for("EXITED 0", 10);
    assert!(s.contains("decision log:"), "{s}");
    assert_eq!(t.alternate_on(), "0", "alternate screen left");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_commit_stays_and_the_terminal_keeps_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.jsonl");
    let cmd = format!(
        "cd {} && {} demo --identities 3000 --seed 9 --sandbox-latency 50ms --decision-log {}; echo EXITED $?; sleep 600",
        dir.path().display(),
        bin(),
        log.display()
    );
    let t = Tmux::start("pause", &cmd);
    t.wait_for("scanned 3000 identities", 30);
    t.keys(&["3", "A"]);
    t.wait_for("Accept all remaining proposals?", 5);
    t.keys(&["y", "4", "Enter"]);
    t.wait_for("Type yes", 5);
    t.keys(&["y", "e", "s", "Enter"]);
    t.wait_for("Commit: Running", 10);
    t.keys(&["p"]);
    let s = t.wait_for("not written:", 30);
    assert!(s.contains("stopped"), "{s}");
    assert_eq!(t.alternate_on(), "1", "a pause stays in the TUI");
    // r resumes, then Ctrl-C stops again and quits.
    t.keys(&["r"]);
    t.wait_for("Commit: Running", 10);
    t.keys(&["C-c"]);
    // Writes left not made: exit 1, as `tui --help` and a headless apply say.
    let s = t.wait_for("EXITED 1", 60);
    assert_eq!(t.alternate_on(), "0");
    let summary = s
        .lines()
        .find(|l| l.starts_with("commit: "))
        .unwrap_or_else(|| panic!("no summary on the terminal:\n{s}"));
    assert!(
        summary.contains(" created, ") && summary.contains(" not attempted"),
        "{summary}"
    );
    assert!(s.contains("to finish:"), "{s}");
    assert!(s.contains("decision log:"), "{s}");
}

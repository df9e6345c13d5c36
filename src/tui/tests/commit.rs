//! The TUI's commit: every decision and the word yes first, its progress, a pause and r, no quitting while it runs.

use super::*;

#[test]
fn commit_needs_every_decision_and_the_word_yes() {
    let mut m = scanned_model();
    update(&mut m, key('4'));
    update(&mut m, code(KeyCode::Enter));
    assert!(matches!(&m.modal, Some(Modal::Message(t)) if t.contains("need a decision")));
    update(&mut m, code(KeyCode::Esc));
    update(&mut m, key('3'));
    update(&mut m, key('A'));
    assert!(matches!(
        m.modal,
        Some(Modal::ConfirmAcceptAll { count: 3 })
    ));
    let cmds = update(&mut m, key('y'));
    assert_eq!(logged(&cmds).len(), 3);
    assert_eq!(m.undecided(), 0);
    update(&mut m, key('4'));
    update(&mut m, code(KeyCode::Enter));
    for c in "no".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(cmds.is_empty(), "only yes commits");
    assert!(matches!(&m.modal, Some(Modal::ConfirmCommit { typed }) if typed.is_empty()));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    match &cmds[..] {
        [
            Command::Send(Request::Commit {
                generation: 1,
                items,
            }),
        ] => assert_eq!(items.len(), 7),
        other => panic!("{other:?}"),
    }
    assert_eq!(m.commit.phase, CommitPhase::Running);
}

#[test]
fn progress_signal_and_stale_commit_results() {
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    update(
        &mut m,
        Msg::Engine(Event::Apply(ApplyEvent::Started {
            deletes: 0,
            already_gone: 0,
            writes: 4,
            total: 7,
        })),
    );
    update(
        &mut m,
        Msg::Progress(Progress {
            total: 7,
            writes: 4,
            done: 2,
            created: 1,
            deleted: 0,
            failed: 1,
            retries: 3,
            throttled: 0,
        }),
    );
    update(
        &mut m,
        Msg::Engine(Event::Apply(ApplyEvent::Problem(OpResult {
            error: Some("HTTP 500".into()),
            attempts: 8,
            ..OpResult::new("304", Some(304), Outcome::Failed)
        }))),
    );
    assert_eq!(m.commit.retries, 3);
    assert_eq!(
        (m.commit.done, m.commit.created, m.commit.failures.len()),
        (2, 1, 1)
    );
    // A dropped SSH session: stop new writes, quit when the commit has finished.
    let cmds = update(&mut m, Msg::Signal);
    assert!(matches!(cmds[..], [Command::Send(Request::Stop)]));
    assert!(!m.quit);
    let report = ApplyReport {
        stopped: Some("stopped by the operator".into()),
        ..Default::default()
    };
    update(&mut m, committed(99, report.clone()));
    assert!(!m.quit, "a result for another commit is ignored");
    update(&mut m, committed(1, report));
    assert!(m.quit);
    assert_eq!(m.commit.phase, CommitPhase::Done);
}

#[test]
fn quit_is_refused_while_a_commit_runs() {
    let mut m = scanned_model();
    m.commit.phase = CommitPhase::Running;
    update(&mut m, key('q'));
    assert!(!m.quit);
    update(&mut m, code(KeyCode::Esc));
    let cmds = update(
        &mut m,
        Msg::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
    );
    assert!(matches!(cmds[..], [Command::Send(Request::Stop)]));
}

#[test]
fn pause_stays_and_r_resumes_what_is_left() {
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    assert_eq!(m.commit.phase, CommitPhase::Running);
    let cmds = update(&mut m, key('p'));
    assert!(matches!(cmds[..], [Command::Send(Request::Stop)]));
    assert_eq!(m.commit.phase, CommitPhase::Stopping);
    let mut report = ApplyReport {
        stopped: Some("stopped by the operator".into()),
        ..Default::default()
    };
    report
        .results
        .push(OpResult::new("301", Some(301), Outcome::Created));
    report
        .results
        .push(OpResult::new("303", Some(303), Outcome::NotAttempted));
    let generation = m.commit.generation;
    update(&mut m, committed(generation, report));
    assert!(!m.quit, "a pause stays");
    assert_eq!(m.commit.phase, CommitPhase::Done);
    let screen = render(&m);
    assert!(
        screen.contains("written: 1 created, 0 already there · not written: 1 not attempted"),
        "{screen}"
    );
    assert!(screen.contains("Commit: Paused"), "{screen}");
    assert!(
        screen.contains("created 1 of") && !screen.contains("ETA 0s"),
        "{screen}"
    );
    let summary = crate::tui::CommitSummary::of(&m).unwrap();
    assert!(summary.unfinished());
    assert_eq!(
        summary.to_string(),
        "commit: 1 created, 0 already there, 1 not attempted, 0 failed (stopped)"
    );
    // r during the rescan that follows a commit waits for it, then resumes: the same
    // decisions go out again.
    assert!(m.scan.scanning);
    assert!(update(&mut m, key('r')).is_empty());
    let generation = m.scan.generation;
    let cmds = update(&mut m, Msg::Engine(scan_event(generation)));
    assert!(
        matches!(&cmds[..], [Command::Send(Request::Commit { .. })]),
        "{cmds:?}"
    );
    assert_eq!(m.commit.phase, CommitPhase::Running);
    assert!(
        render(&m).contains("earlier this session: 1 created"),
        "{}",
        render(&m)
    );
    // The resumed commit writes the rest; the panel and the quit summary count both.
    let mut rest = ApplyReport::default();
    rest.results
        .push(OpResult::new("303", Some(303), Outcome::Created));
    let generation = m.commit.generation;
    update(&mut m, committed(generation, rest));
    let screen = render(&m);
    assert!(screen.contains("Commit: Done"), "{screen}");
    assert!(
        screen.contains("this session: 2 created, 0 already there, in 2 commits"),
        "{screen}"
    );
    assert_eq!(
        crate::tui::CommitSummary::of(&m).unwrap().to_string(),
        "commit: 2 created, 0 already there, 0 not attempted, 0 failed (this session, 2 commits)"
    );
}

// ---- snapshots ---------------------------------------------------------------------------

//! The TUI's audit screen: audited on its first visit and again on r, stale answers dropped, its picture.

use super::*;

/// An audit of a small world: a split with a node behind it, a double, and one id only
/// Kubernetes holds.
fn audit_run() -> crate::app::audit::AuditRun {
    use crate::core::audit::{AuditInput, AuditObject, ValueKey, audit};
    let a = sl("k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;");
    let b = sl("k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;");
    let masters = vec![MasterEntry::new("300", &*a), MasterEntry::new("301", &*b)];
    let values = vec![ValueKey {
        label_key: a.clone(),
        node: "10.0.0.1".into(),
        id: "300".into(),
    }];
    let objects = vec![
        AuditObject {
            id: 300,
            labels: b.as_str().into(),
            gc_marked: false,
        },
        AuditObject {
            id: 400,
            labels: a.as_str().into(),
            gc_marked: false,
        },
    ];
    crate::app::audit::AuditRun {
        report: audit(&AuditInput {
            masters: &masters,
            values: &values,
            objects: &objects,
            endpoints: None,
            range: IdRange::for_cluster(0).unwrap(),
        }),
        kvstore_revision: 42,
        not_checked: vec![
            "endpoints behind findings: ciliumendpoints.cilium.io is not served".into(),
        ],
    }
}

fn audit_requests(cmds: &[Command]) -> Vec<u64> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Send(Request::Audit { generation }) => Some(*generation),
            _ => None,
        })
        .collect()
}

#[test]
fn the_audit_screen_audits_on_its_first_visit_and_again_on_r_dropping_stale_answers() {
    let mut m = scanned_model();
    assert_eq!(audit_requests(&update(&mut m, key('6'))), vec![1]);
    assert_eq!(m.screen, Screen::Audit);
    assert!(render(&m).contains("reading the kvstore"), "{}", render(&m));
    // Running: neither a second visit nor R asks again.
    update(&mut m, key('1'));
    assert!(audit_requests(&update(&mut m, key('6'))).is_empty());
    assert!(audit_requests(&update(&mut m, key('R'))).is_empty());
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation: 1,
            run: Box::new(audit_run()),
        }),
    );
    assert!(!m.audit.running);
    let counts = &m.audit.run.as_ref().unwrap().report.counts;
    assert_eq!((counts["split"], counts["double"]), (1, 2));
    assert!(render(&m).contains("split 300"), "{}", render(&m));
    // A later visit shows that audit; R reads again, and the old answer is dropped.
    update(&mut m, key('1'));
    assert!(audit_requests(&update(&mut m, key('6'))).is_empty());
    assert_eq!(audit_requests(&update(&mut m, key('R'))), vec![2]);
    let mut stale = audit_run();
    stale.kvstore_revision = 7;
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation: 1,
            run: Box::new(stale),
        }),
    );
    assert!(m.audit.running, "a stale answer ends nothing");
    assert_eq!(m.audit.run.as_ref().unwrap().kvstore_revision, 42);
    update(
        &mut m,
        Msg::Engine(Event::Failed {
            generation: 2,
            task: crate::app::service::Task::Audit,
            error: std::sync::Arc::new(crate::Error::Config("etcd is down".into())),
        }),
    );
    assert!(!m.audit.running);
    assert!(matches!(&m.modal, Some(Modal::Message(t)) if t.contains("audit failed")));
    // Scrolling stays within the findings.
    m.modal = None;
    let n = m.audit.run.as_ref().unwrap().report.findings.len();
    for _ in 0..10 {
        update(&mut m, code(KeyCode::Down));
    }
    assert_eq!(m.audit.offset, n - 1);
    update(&mut m, code(KeyCode::PageUp));
    assert_eq!(m.audit.offset, 0);
}

#[test]
fn the_audit_screen_matches_its_snapshot() {
    let mut m = scanned_model();
    update(&mut m, key('6'));
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation: 1,
            run: Box::new(audit_run()),
        }),
    );
    check_screen("audit", &mut m);
}

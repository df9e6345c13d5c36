//! The TUI's Switch screen: read on its first visit and again on R, stale answers dropped,
//! n/N between the pods that need something, and its picture.

use super::*;
use crate::core::switch::report::SwitchReport;
use crate::core::switch::report::tests::{full_set, identity, pod, report_with};

/// Four pods: web adopted, api re-minted (its identity predates the namespace's name label,
/// and its endpoint moves), two with no identity.
fn report() -> SwitchReport {
    let mut old_api = full_set("api");
    old_api.remove("k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name");
    report_with(
        &[
            pod("shop", "api-1", "api"),
            pod("shop", "new-1", "new"),
            pod("shop", "new-2", "new"),
            pod("shop", "web-1", "web"),
        ],
        &[
            identity(1000, full_set("web"), 0, true),
            identity(1001, old_api, 0, true),
        ],
        &[("shop/api-1".to_string(), 1001)].into(),
    )
}

fn switch_requests(cmds: &[Command]) -> Vec<u64> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Send(Request::Switch { generation }) => Some(*generation),
            _ => None,
        })
        .collect()
}

fn arrive(m: &mut Model, generation: u64, report: SwitchReport) {
    update(
        m,
        Msg::Engine(Event::SwitchRead {
            generation,
            report: Box::new(report),
        }),
    );
}

#[test]
fn the_switch_screen_reads_on_its_first_visit_and_moves_between_pods_as_the_review_does() {
    let mut m = scanned_model();
    assert_eq!(switch_requests(&update(&mut m, key('7'))), vec![1]);
    assert_eq!(m.screen, Screen::Switch);
    assert!(render(&m).contains("reading pods"), "{}", render(&m));
    // Running: neither a second visit nor R asks again.
    update(&mut m, key('1'));
    assert!(switch_requests(&update(&mut m, key('7'))).is_empty());
    assert!(switch_requests(&update(&mut m, key('R'))).is_empty());
    arrive(&mut m, 1, report());
    assert!(!m.switch.running);
    let pod = |m: &Model| m.switch.current().unwrap().pod.clone();
    // The first pod that needs something is selected: api, re-minted.
    assert_eq!(pod(&m), "shop/api-1");
    assert!(render(&m).contains("re-minted"), "{}", render(&m));
    // n and N move between the pods the switch does not simply adopt, wrapping around.
    update(&mut m, key('n'));
    assert_eq!(pod(&m), "shop/new-1");
    update(&mut m, key('n'));
    assert_eq!(pod(&m), "shop/new-2");
    update(&mut m, key('n'));
    assert_eq!(pod(&m), "shop/api-1", "web is adopted: skipped");
    update(&mut m, key('N'));
    assert_eq!(pod(&m), "shop/new-2");
    update(&mut m, key('G'));
    assert_eq!(pod(&m), "shop/web-1");
    update(&mut m, code(KeyCode::Up));
    assert_eq!(pod(&m), "shop/new-2");
    update(&mut m, key('g'));
    assert_eq!(pod(&m), "shop/api-1");
    // R reads again; a stale answer is dropped, a failure is said.
    assert_eq!(switch_requests(&update(&mut m, key('R'))), vec![2]);
    arrive(
        &mut m,
        1,
        SwitchReport {
            pods: vec![],
            ..report()
        },
    );
    assert!(m.switch.running, "a stale answer ends nothing");
    assert_eq!(m.switch.report.as_ref().unwrap().pods.len(), 4);
    update(
        &mut m,
        Msg::Engine(Event::Failed {
            generation: 2,
            task: crate::app::service::Task::Switch,
            error: std::sync::Arc::new(crate::Error::Config("no pods for you".into())),
        }),
    );
    assert!(!m.switch.running);
    assert!(matches!(&m.modal, Some(Modal::Message(t)) if t.contains("switch report failed")));
}

#[test]
fn the_switch_screen_matches_its_snapshot() {
    let mut m = scanned_model();
    update(&mut m, key('7'));
    arrive(&mut m, 1, report());
    check_screen("switch", &mut m);
}

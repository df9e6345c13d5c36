//! When a split is reported, and with what.

use std::time::{Duration, Instant};

use super::*;

fn found(kv_value: &str, at: Instant) -> SplitFound {
    SplitFound {
        id: 300,
        k8s_labels: "k8s:app=b;".into(),
        kv_value: kv_value.as_bytes().to_vec(),
        found: at,
    }
}

#[test]
fn a_split_waits_for_its_nodes_up_to_the_wait_and_no_longer() {
    let t0 = Instant::now();
    let f = found("k8s:app=a;", t0);
    assert_eq!(named(&f, vec![], t0), Named::Wait);
    let almost = t0 + SPLIT_NODES_WAIT - Duration::from_millis(1);
    assert_eq!(named(&f, vec![], almost), Named::Wait);
    // A node named: at once, with it.
    let Named::Report(with) = named(&f, vec!["node-1".into()], t0) else {
        panic!("not reported with its node");
    };
    assert_eq!(
        (
            with.id,
            with.kvstore_labels.as_str(),
            with.k8s_labels.as_str()
        ),
        (300, "k8s:app=a;", "k8s:app=b;")
    );
    assert_eq!(with.nodes, ["node-1"]);
    // None by the end of the wait: reported without.
    let Named::Report(without) = named(&f, vec![], t0 + SPLIT_NODES_WAIT) else {
        panic!("not reported once the wait was over");
    };
    assert!(without.nodes.is_empty());
    assert!(without.to_string().contains("nothing to roll"), "{without}");
}

#[test]
fn a_kvstore_value_that_is_no_label_key_is_no_split_to_report() {
    let t0 = Instant::now();
    let f = found("not a label key", t0);
    assert_eq!(named(&f, vec!["node-1".into()], t0), Named::NotLabels);
    // Nor once the wait for its nodes is over.
    assert_eq!(named(&f, vec![], t0 + SPLIT_NODES_WAIT), Named::NotLabels);
}

#[test]
fn a_split_reads_on_a_terminal_as_what_to_do_then_each_label_set_on_its_own_line() {
    let t0 = Instant::now();
    let f = found("k8s:app=a;", t0);
    let Named::Report(with) = named(&f, vec!["node-1".into(), "node-2".into()], t0) else {
        panic!("not reported with its nodes");
    };
    assert_eq!(
        with.lines(),
        [
            "split allocation at id 300: roll node-1, node-2 to CRD mode next (until then policy between them and CRD-mode nodes reads 300 as the wrong labels; the kvstore's labels get a remap proposal)",
            "  the kvstore holds  k8s:app=a;",
            "  Kubernetes holds   k8s:app=b;",
        ]
    );
    let Named::Report(without) = named(&f, vec![], t0 + SPLIT_NODES_WAIT) else {
        panic!("not reported once the wait was over");
    };
    assert!(
        without.lines()[0].contains("nothing to roll"),
        "{:?}",
        without.lines()
    );
}

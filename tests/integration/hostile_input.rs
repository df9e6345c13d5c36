//! Hostile input: property tests with large case counts over the parsers that read what an
//! operator or a damaged cluster hands us (label keys, kvstore keys and ids, plan files,
//! decision logs). None may panic; malformed kvstore data must become `invalid`, never a write.
//! `IDMIG_FUZZ_CASES` sets the number of cases per target (default 10,000).

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use cilium_idmig::core::kvstore::{MasterEntry, classify_key, parse_id};
use cilium_idmig::core::labels::{encode_label_key, parse_label_key, parse_label_key_bytes};
use cilium_idmig::core::planner::{Action, Kind, plan, reconcile};
use cilium_idmig::core::range::IdRange;
use cilium_idmig::io::decision_log;
use cilium_idmig::io::plan_file::PlanFile;

fn cases() -> u32 {
    std::env::var("IDMIG_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

/// Bytes biased towards the characters that matter to the formats.
fn format_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            4 => prop::sample::select(b"k8s:app=web;/0123456789+-= :;\\\"{}[],".to_vec()),
            1 => any::<u8>(),
        ],
        0..80,
    )
}

fn sample_plan_json() -> String {
    let items = plan(
        &[
            MasterEntry::new("300", "k8s:a=1;"),
            MasterEntry::new("301", "k8s:a=2;"),
            MasterEntry::new("x", "k8s:a=3;"),
        ],
        &HashMap::new(),
        &BTreeMap::new(),
        IdRange::for_cluster(0).unwrap(),
    );
    let p = PlanFile::new(
        Default::default(),
        Default::default(),
        cilium_idmig::core::range::ClusterScope::new(0, Default::default()).unwrap(),
        true,
        items,
    );
    serde_json::to_string(&p).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn label_key_parser_never_panics_and_round_trips(raw in format_bytes()) {
        if let Ok(labels) = parse_label_key_bytes(&raw) {
            // Whatever parses is exactly what Cilium's writer would produce.
            let encoded = encode_label_key(&labels);
            prop_assert_eq!(encoded.as_bytes(), &raw[..]);
        }
    }

    #[test]
    fn kvstore_keys_and_ids_never_panic(key in format_bytes(), id in format_bytes()) {
        let mut full = b"cilium/state/identities/v1/".to_vec();
        full.extend_from_slice(&key);
        let _ = classify_key("cilium/state/identities/v1/", &full);
        if let Ok(n) = parse_id(&id) {
            let text = n.to_string();
            prop_assert_eq!(text.as_bytes(), &id[..]);
        }
    }

    #[test]
    fn malformed_kvstore_entries_are_never_written(id in format_bytes(), value in format_bytes()) {
        let masters = vec![MasterEntry::new(id.clone(), value.clone())];
        let items = plan(&masters, &HashMap::new(), &BTreeMap::new(), IdRange::for_cluster(0).unwrap());
        prop_assert_eq!(items.len(), 1);
        let valid = parse_id(&id).is_ok_and(|n| IdRange::for_cluster(0).unwrap().contains(n))
            && parse_label_key_bytes(&value).is_ok();
        if !valid {
            prop_assert_eq!(items[0].kind, Kind::Invalid);
            prop_assert_eq!(items[0].action, Action::Skip);
            let ops = reconcile(&items, &items, &BTreeMap::new(), IdRange::for_cluster(0).unwrap(), true).unwrap().ops;
            prop_assert!(ops.iter().all(|o| o.op == cilium_idmig::core::planner::OpKind::Skip));
        }
    }

    #[test]
    fn plan_loader_never_panics_on_mutated_plans(pos in 0usize..2000, cut in 0usize..2000, junk in format_bytes()) {
        let text = sample_plan_json().into_bytes();
        let pos = pos.min(text.len());
        let cut = (pos + cut).min(text.len());
        let mut mutated = text[..pos].to_vec();
        mutated.extend_from_slice(&junk);
        mutated.extend_from_slice(&text[cut..]);
        let _ = PlanFile::from_slice(&mutated);
        let _ = PlanFile::from_slice(&junk);
    }

    #[test]
    fn decision_log_reader_never_panics(lines in proptest::collection::vec(format_bytes(), 0..6)) {
        let good = r#"{"ts":"t","operator":"o","id":"300","labels":"k8s:a=b;","kind":"create","decision":"create","target_id":300,"outcome":"created","error":null}"#;
        // The good line is whole (its newline written); the hostile ones follow it, the
        // last one without a newline, as a line cut short would be.
        let mut text = good.as_bytes().to_vec();
        text.push(b'\n');
        for (n, l) in lines.iter().enumerate() {
            if n > 0 {
                text.push(b'\n');
            }
            text.extend_from_slice(l);
        }
        let c = decision_log::read_from(&text[..]).unwrap();
        prop_assert!(!c.records.is_empty());
    }
}

#[test]
fn every_malformation_named_in_the_issue_is_invalid() {
    let huge = format!("k8s:app={};", "x".repeat(2 << 20));
    let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"300".to_vec(), b"k8s:app=\xff\xfe;".to_vec()),
        (b"30\xff".to_vec(), b"k8s:app=a;".to_vec()),
        (b"+300".to_vec(), b"k8s:app=a;".to_vec()),
        (b"-300".to_vec(), b"k8s:app=a;".to_vec()),
        (b"0300".to_vec(), b"k8s:app=a;".to_vec()),
        (b"4294967296".to_vec(), b"k8s:app=a;".to_vec()),
        (b"99999999999999999999".to_vec(), b"k8s:app=a;".to_vec()),
        (b"301".to_vec(), b"k8s:app=a;k8s:app=b;".to_vec()),
        (b"302".to_vec(), b"k8s:app;".to_vec()),
        (b"303".to_vec(), b"k8s:app=a".to_vec()),
        (b"304".to_vec(), b"".to_vec()),
        (b"305".to_vec(), b";".to_vec()),
        (b"306".to_vec(), b"app=a;".to_vec()),
        (b"307".to_vec(), b"k8s:b=1;k8s:a=2;".to_vec()),
        (b"5".to_vec(), b"reserved:host=;".to_vec()),
        (b"70000".to_vec(), b"k8s:app=a;".to_vec()),
    ];
    let mut masters: Vec<MasterEntry> = cases
        .into_iter()
        .map(|(i, v)| MasterEntry::new(i, v))
        .collect();
    masters.push(MasterEntry::new("308", huge.clone()));
    let items = plan(
        &masters,
        &HashMap::new(),
        &BTreeMap::new(),
        IdRange::for_cluster(0).unwrap(),
    );
    for i in &items {
        if i.id == "308" {
            // Well-formed but larger than anything Cilium writes: invalid, the reason names
            // the size, and the labels are kept whole for the record.
            assert_eq!(i.kind, Kind::Invalid);
            assert!(i.reason.contains(&huge.len().to_string()), "{}", i.reason);
            assert_eq!(i.labels.len(), huge.len());
            continue;
        }
        assert_eq!(i.kind, Kind::Invalid, "{} {:?}", i.id, i.labels);
        assert!(!i.reason.is_empty());
    }
    assert!(parse_label_key("k8s:a=1;k8s:a=1;").is_err());
}

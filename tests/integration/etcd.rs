//! The etcd source against a real etcd: paging, pinned revision, slave-key counting, TLS.

use cilium_idmig::Error;
use cilium_idmig::io::etcd::{EtcdOptions, read_snapshot};

use crate::harness::Etcd;

const P: &str = "cilium/state/identities/v1";

fn opts(etcd: &Etcd, page: i64) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![etcd.endpoint.clone()],
        page_size: page,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_masters_and_counts_nodes_in_pages() {
    let etcd = Etcd::start().await;
    for i in 0..50u32 {
        etcd.put(
            &format!("{P}/id/{}", 300 + i),
            format!("k8s:app=a{i};").as_bytes(),
        )
        .await;
    }
    etcd.put(&format!("{P}/id/0300"), b"k8s:app=zero;").await;
    etcd.put(&format!("{P}/id/999"), b"k8s:app=\xff;").await;
    // A label key that contains '/': the node is after the last slash.
    let slashy = "k8s:app.kubernetes.io/name=web;";
    etcd.put(&format!("{P}/id/400"), slashy.as_bytes()).await;
    for node in ["10.0.0.1", "10.0.0.2", "node-c"] {
        etcd.put(&format!("{P}/value/{slashy}/{node}"), b"400")
            .await;
    }
    etcd.put(&format!("{P}/value/k8s:app=a1;/n1"), b"301").await;
    etcd.put(&format!("{P}/locks/k8s:app=a1;/lease"), b"").await;
    etcd.put("cilium/state/other/id/1", b"k8s:app=not-ours;")
        .await;

    let snap = read_snapshot(&opts(&etcd, 7)).await.unwrap();
    assert_eq!(snap.masters.len(), 53);
    assert!(snap.source.revision > 0);
    assert_eq!(snap.source.prefix, P);
    assert!(snap.masters.iter().any(|m| m.id == b"0300"));
    assert!(
        snap.masters.iter().any(|m| m.value == b"k8s:app=\xff;"),
        "non-UTF-8 values arrive untouched"
    );
    assert_eq!(snap.node_counts.get(slashy.as_bytes()), 3);
    assert_eq!(snap.node_counts.get(b"k8s:app=a1;".as_slice()), 1);
    assert_eq!(
        snap.node_counts.len(),
        2,
        "lock keys are not node references"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_label_keys_nodes_are_counted_across_the_parts_read_at_once() {
    // Enough label keys that the `value/` space is read as two parts at once, each in
    // ranges of a few keys: every count must come out whole, none twice.
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await.unwrap();
    for i in 0..400u32 {
        let labels = format!("k8s:app=w{i:03};");
        c.put(format!("{P}/id/{}", 300 + i), labels.clone(), None)
            .await
            .unwrap();
        for n in 0..i % 5 {
            c.put(
                format!("{P}/value/{labels}/node-{n}"),
                (300 + i).to_string(),
                None,
            )
            .await
            .unwrap();
        }
    }
    let snap = read_snapshot(&opts(&etcd, 7)).await.unwrap();
    for i in 0..400u32 {
        let labels = format!("k8s:app=w{i:03};");
        assert_eq!(snap.node_counts.get(labels.as_bytes()), i % 5, "{labels}");
        assert_eq!(
            snap.node_counts
                .of_identity(labels.as_bytes(), (300 + i).to_string().as_bytes()),
            i % 5
        );
    }
    assert_eq!(
        snap.node_counts.total(),
        (0..400u64).map(|i| i % 5).sum::<u64>()
    );
    assert_eq!(snap.node_counts.nodes().count(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_is_pinned_to_one_revision_while_etcd_changes() {
    let etcd = Etcd::start().await;
    for i in 0..300u32 {
        etcd.put(
            &format!("{P}/id/{}", 1000 + i),
            format!("k8s:app=a{i};").as_bytes(),
        )
        .await;
    }
    let writer_client = etcd.client().await.unwrap();
    let writer = tokio::spawn(async move {
        let mut c = writer_client;
        for i in 0..300u32 {
            // Both before and after the reader's position in the key space.
            c.put(format!("{P}/id/{}", 500 + i), "k8s:app=late;", None)
                .await
                .unwrap();
            c.put(format!("{P}/id/{}", 5000 + i), "k8s:app=late;", None)
                .await
                .unwrap();
        }
    });
    let snap = read_snapshot(&opts(&etcd, 5)).await.unwrap();
    writer.await.unwrap();
    let mut c = etcd.client().await.unwrap();
    let at_rev = c
        .get(
            format!("{P}/id/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only()
                    .with_revision(snap.source.revision),
            ),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(
        snap.masters.len() as i64,
        at_rev,
        "exactly the keys present at the pinned revision"
    );
    assert!(snap.masters.len() >= 300);
}

#[tokio::test(flavor = "multi_thread")]
async fn large_values_are_read_across_smaller_pages() {
    let etcd = Etcd::start().await;
    // Six 1 MiB label keys: more than one 4 MiB response can carry.
    for i in 0..6u32 {
        let value = format!("k8s:big={}{i};", "x".repeat(1 << 20));
        etcd.put(&format!("{P}/id/{}", 300 + i), value.as_bytes())
            .await;
    }
    let snap = read_snapshot(&opts(&etcd, 1000)).await.unwrap();
    assert_eq!(snap.masters.len(), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_client_certificates_via_cilium_config_file() {
    let etcd = Etcd::start_tls().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=tls;").await;
    let o = EtcdOptions {
        config_file: Some(etcd.config_file()),
        ..Default::default()
    };
    let snap = read_snapshot(&o).await.unwrap();
    assert_eq!(snap.masters.len(), 1);
    assert_eq!(snap.source.endpoints, vec![etcd.endpoint.clone()]);

    // Without the client certificate the server refuses, and the error names the endpoint.
    let cfg = etcd.dir.path().join("no-cert.yaml");
    let t = etcd.tls.as_ref().unwrap();
    std::fs::write(
        &cfg,
        format!(
            "endpoints: [{}]\ntrusted-ca-file: {}\n",
            etcd.endpoint,
            t.ca.display()
        ),
    )
    .unwrap();
    let o = EtcdOptions {
        config_file: Some(cfg),
        timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    let err = read_snapshot(&o).await.unwrap_err();
    assert!(matches!(err, Error::Etcd { .. }), "{err}");
    assert!(err.to_string().contains(&etcd.endpoint), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_or_missing_config_is_a_clear_error() {
    let port = crate::harness::free_port();
    let o = EtcdOptions {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        timeout: std::time::Duration::from_secs(3),
        ..Default::default()
    };
    let err = read_snapshot(&o).await.unwrap_err().to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let err = read_snapshot(&EtcdOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("--etcd-endpoints"), "{err}");
    let o = EtcdOptions {
        config_file: Some("/nonexistent/etcd.yaml".into()),
        ..Default::default()
    };
    let err = read_snapshot(&o).await.unwrap_err().to_string();
    assert!(
        err.contains("/nonexistent/etcd.yaml")
            && err.contains("no such etcd config (--etcd-config)"),
        "says which file it is: {err}"
    );
}

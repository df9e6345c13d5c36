//! Reads of a migrated cluster on a modelled API server: every identity already migrated,
//! `value/` keys from 8 nodes, and a sandbox whose reads cost what a real kube-apiserver 1.19
//! with etcd 3.4 on 2 cores costs (`ReadModel::measured`: about 260 µs an object for a paged
//! quorum read, 70 µs for the watch cache's one response, no streaming lists). For 1,000,
//! 10,000 and 65,280 identities, in one run: the raw cache list (bytes only, nothing parsed),
//! `plan`, an `apply` rerun, `verify`, `plan --consistent-reads` (wall and peak RSS of the
//! real processes), and the TUI's first screen and full table. `cargo bench --bench reads`;
//! `IDMIG_BENCH_SIZES=1000,10000` picks sizes, `IDMIG_BENCH_HOLD=1` keeps each size's etcd
//! and API server up for profiling by hand. Prints a Markdown table.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use cilium_idmig::app::service::{self, ServiceConfig, ServiceEvent, ServiceRequest};
use cilium_idmig::apply::executor::ApplyOptions;
use cilium_idmig::core::range::ClusterScope;
use cilium_idmig::io::decision_log::DecisionLog;
use cilium_idmig::io::etcd::EtcdOptions;
use cilium_idmig::io::k8s::K8sTarget;
use cilium_idmig::io::kv_source::KvSource;
use cilium_idmig::sandbox::generator::{self, GenConfig};
use cilium_idmig::sandbox::{ReadModel, Sandbox, SandboxConfig};

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::{Etcd, load_etcd};

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Wall time and peak RSS (MiB) of a whole process, from `/usr/bin/time`.
fn measured(args: &[&str]) -> (Duration, f64) {
    let start = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "IDMIG_MAXRSS=%M", env!("CARGO_BIN_EXE_cilium-idmig")])
        .args(args)
        .stdout(Stdio::null())
        .output()
        .expect("run /usr/bin/time (Debian package `time`)");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        took,
        support::proc_stats::max_rss_mib(&stderr).unwrap_or(-1.0 / 1024.0),
    )
}

/// GETs `path` and reads the body to its end without parsing it: what the server needs to
/// send the list.
async fn raw_get(base: &str, path: &str) -> (Duration, usize) {
    let addr = base.trim_start_matches("http://");
    let start = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        total += n;
    }
    (start.elapsed(), total)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("reads benchmark: run it with `cargo bench --bench reads`");
        return;
    }
    let sizes: Vec<usize> = std::env::var("IDMIG_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000,65280".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let etcd = Etcd::start().await;
    let mut rows = Vec::new();
    for &n in &sizes {
        eprintln!("== {n} identities, all migrated");
        let prefix = format!("reads{n}/cilium/state/identities/v1");
        let data = generator::generate(&GenConfig {
            identities: n,
            nodes: 8,
            every_node: true,
            seed: n as u64,
            migrated: 1.0,
            remap: 0.0,
            reuse: 0.0,
            duplicate: 0.0,
            invalid: 0.0,
            ..Default::default()
        })
        .expect("generate");
        let mut client = etcd.client().await.expect("etcd client");
        load_etcd(&mut client, &prefix, &data).await;
        let sb = Sandbox::start(SandboxConfig {
            reads: ReadModel::measured(),
            ..Default::default()
        })
        .await
        .expect("sandbox");
        for (id, labels) in &data.k8s {
            sb.seed_identity(*id, labels);
        }
        assert_eq!(sb.objects().len(), n, "every identity migrated");
        let dir = tempfile::tempdir().expect("tempdir");
        let kc = dir.path().join("kubeconfig");
        sb.write_kubeconfig(&kc).expect("kubeconfig");
        let kc = kc.display().to_string();
        let log = dir.path().join("log.jsonl").display().to_string();
        let conn = [
            "--etcd-endpoints",
            etcd.endpoint.as_str(),
            "--kvstore-prefix",
            prefix.as_str(),
            "--kubeconfig",
            kc.as_str(),
        ];
        let with = |cmd: &[&str]| -> Vec<String> {
            cmd.iter()
                .chain(conn.iter())
                .map(|s| s.to_string())
                .collect()
        };
        let run = |cmd: Vec<String>| {
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            measured(&args)
        };
        if std::env::var_os("IDMIG_BENCH_HOLD").is_some() {
            // Keep this size's etcd and API server up, to profile a command by hand.
            eprintln!(
                "holding: {} plan {}",
                env!("CARGO_BIN_EXE_cilium-idmig"),
                conn.join(" ")
            );
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let ids = "/apis/cilium.io/v2/ciliumidentities";
        let (raw_cache, bytes) = raw_get(&sb.url(), &format!("{ids}?resourceVersion=0")).await;
        eprintln!("   raw cache list {} ({} MB)", secs(raw_cache), bytes >> 20);
        let plan = run(with(&["plan"]));
        eprintln!("   plan {} {:.0} MiB", secs(plan.0), plan.1);
        let rerun = run(with(&["apply", "--yes", "--decision-log", &log]));
        eprintln!("   rerun {} {:.0} MiB", secs(rerun.0), rerun.1);
        let verify = run(with(&["verify"]));
        eprintln!("   verify {} {:.0} MiB", secs(verify.0), verify.1);
        let quorum_plan = run(with(&["plan", "--consistent-reads"]));
        eprintln!(
            "   plan --consistent-reads {} {:.0} MiB",
            secs(quorum_plan.0),
            quorum_plan.1
        );
        assert_eq!(
            sb.request_count("POST ciliumidentities"),
            0,
            "a rerun writes nothing"
        );

        // The TUI's engine: the first screen (the kvstore side) and the whole table.
        let target = K8sTarget::from_url(&sb.url()).expect("target");
        let handle = service::spawn(ServiceConfig {
            kv: KvSource::Etcd(EtcdOptions {
                endpoints: vec![etcd.endpoint.clone()],
                prefix: prefix.clone(),
                ..Default::default()
            }),
            target,
            scope: ClusterScope::new(0, Default::default()).expect("scope"),
            log: Arc::new(DecisionLog::open(&dir.path().join("tui.jsonl")).expect("log")),
            apply: ApplyOptions::default(),
            command: "bench",
            resume: Vec::new(),
            sync_reserve_in_kvstore: false,
            cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
        });
        let service::Handle {
            requests,
            mut events,
            ..
        } = handle;
        let start = Instant::now();
        requests
            .send(ServiceRequest::Scan { generation: 1 })
            .await
            .expect("scan");
        let (mut first, mut full) = (None, None);
        while full.is_none() {
            match events.recv().await.expect("events") {
                ServiceEvent::KvRead { .. } => first = Some(start.elapsed()),
                ServiceEvent::Scanned { scan, .. } => {
                    assert_eq!(scan.items.len(), n);
                    full = Some(start.elapsed());
                }
                ServiceEvent::Failed { error, .. } => panic!("scan failed: {error}"),
                _ => {}
            }
        }
        let (first, full) = (first.expect("first screen"), full.expect("table"));
        eprintln!(
            "   TUI first screen {} full table {}",
            secs(first),
            secs(full)
        );
        rows.push((
            n,
            raw_cache,
            bytes,
            plan,
            rerun,
            verify,
            quorum_plan,
            first,
            full,
        ));
    }
    println!(
        "| N | raw cache list (server) | `plan` | rerun (`apply`, nothing to write) | `verify` (quorum) | `plan --consistent-reads` | TUI first screen / full table | peak RSS: plan / rerun / verify |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (n, raw, bytes, plan, rerun, verify, qplan, first, full) in rows {
        println!(
            "| {n} | {} ({} MB) | {} ({:.1}x) | {} ({:.1}x) | {} | {} | {} / {} | {:.0} / {:.0} / {:.0} MiB |",
            secs(raw),
            bytes >> 20,
            secs(plan.0),
            plan.0.as_secs_f64() / raw.as_secs_f64(),
            secs(rerun.0),
            rerun.0.as_secs_f64() / raw.as_secs_f64(),
            secs(verify.0),
            secs(qplan.0),
            secs(first),
            secs(full),
            plan.1,
            rerun.1,
            verify.1
        );
    }
}

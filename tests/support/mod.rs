//! Test and benchmark support: a real etcd (Debian's `etcd-server`) on free loopback ports
//! with a temp data dir, plain or with TLS and client certificates. Never port 2379. Like test
//! code, it panics on failure: it is for the test suite and the benchmarks only.

// Parts of it (the side-by-side figures) are read only by `benches/rollout.rs`.
#[allow(dead_code)]
pub mod cilium_rollout;
pub mod control_plane;
// Read only by the benchmarks.
#[allow(dead_code)]
pub mod proc_stats;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use cilium_idmig::sandbox::generator::Generated;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn etcd_bin() -> String {
    let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    let ok = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        ok,
        "etcd not found ({bin}): install Debian's etcd-server (`apt-get install etcd-server`) or set ETCD_BIN"
    );
    bin
}

/// Client TLS material for an etcd started with `Etcd::start_tls`.
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Etcd {
    child: Child,
    /// How it was started, to start it again on the same data and port.
    command: (String, Vec<String>),
    pub dir: TempDir,
    pub endpoint: String,
    pub tls: Option<TlsFiles>,
}

impl Etcd {
    pub async fn start() -> Etcd {
        Self::spawn(false, &[]).await
    }

    pub async fn start_tls() -> Etcd {
        Self::spawn(true, &[]).await
    }

    async fn spawn(tls: bool, extra: &[&str]) -> Etcd {
        // A free port can be taken by another process (a test's API server, its etcd)
        // between our look and etcd's bind: then new ports, a few times.
        for _ in 0..5 {
            if let Some(etcd) = Self::try_spawn(tls, extra).await {
                return etcd;
            }
        }
        panic!("etcd: its ports were taken five times in a row");
    }

    /// Starts etcd; `None` when a port it was given was taken meanwhile.
    async fn try_spawn(tls: bool, extra: &[&str]) -> Option<Etcd> {
        let bin = etcd_bin();
        let dir = tempfile::tempdir().unwrap();
        let (cport, pport) = (free_port(), free_port());
        let scheme = if tls { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{cport}");
        let peer_url = format!("http://127.0.0.1:{pport}");
        let mut cmd = Command::new(bin);
        cmd.arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            // Room for the millions of value/ keys of the largest benchmark.
            .arg("--quota-backend-bytes=8589934592")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap());
        let tls_files = if tls {
            let t = make_certs(dir.path());
            cmd.arg(format!(
                "--cert-file={}",
                dir.path().join("server.crt").display()
            ))
            .arg(format!(
                "--key-file={}",
                dir.path().join("server.key").display()
            ))
            .arg(format!("--trusted-ca-file={}", t.ca.display()))
            .arg("--client-cert-auth");
            Some(t)
        } else {
            None
        };
        let child = cmd.spawn().expect("start etcd");
        let command = (
            cmd.get_program().to_string_lossy().into_owned(),
            cmd.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        );
        let mut etcd = Etcd {
            child,
            command,
            dir,
            endpoint: client_url,
            tls: tls_files,
        };
        etcd.wait_ready().await.then_some(etcd)
    }

    /// Whether etcd became ready; `false` when it ended because a port was taken.
    async fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        loop {
            if let Ok(mut c) = self.client().await
                && c.status().await.is_ok()
            {
                return true;
            }
            let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
            if matches!(self.child.try_wait(), Ok(Some(_)))
                && log.contains("address already in use")
            {
                return false;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "etcd did not become ready:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client for seeding test data (the tool itself never writes to etcd).
    pub async fn client(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        self.client_as(None).await
    }

    /// A client that logs in as `(user, password)` once etcd auth is on.
    pub async fn client_as(
        &self,
        user: Option<(&str, &str)>,
    ) -> Result<etcd_client::Client, etcd_client::Error> {
        let mut opts =
            etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        if let Some((name, password)) = user {
            opts = opts.with_user(name, password);
        }
        if let Some(t) = &self.tls {
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(
                    std::fs::read(&t.ca).unwrap(),
                ))
                .identity(etcd_client::Identity::from_pem(
                    std::fs::read(&t.cert).unwrap(),
                    std::fs::read(&t.key).unwrap(),
                ));
            opts = opts.with_tls(tls);
        }
        etcd_client::Client::connect([self.endpoint.clone()], Some(opts)).await
    }

    pub async fn put(&self, key: &str, value: &[u8]) {
        self.client()
            .await
            .unwrap()
            .put(key, value, None)
            .await
            .unwrap();
    }

    pub async fn delete(&self, key: &str) {
        self.client()
            .await
            .unwrap()
            .delete(key, None)
            .await
            .unwrap();
    }

    /// Writes an etcd config file in Cilium's format for this server.
    pub fn config_file(&self) -> PathBuf {
        let path = self.dir.path().join("etcd-config.yaml");
        let mut text = format!("endpoints:\n- {}\n", self.endpoint);
        if let Some(t) = &self.tls {
            text.push_str(&format!(
                "trusted-ca-file: {}\ncert-file: {}\nkey-file: {}\n",
                t.ca.display(),
                t.cert.display(),
                t.key.display()
            ));
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Stops etcd (e.g. to test a source that goes away).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops etcd and starts it again on the same data and port (a restart clients outlive).
    pub async fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        self.child = Command::new(&self.command.0)
            .args(&self.command.1)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd again");
        assert!(
            self.wait_ready().await,
            "etcd's port was taken while it was down"
        );
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all EC P-256.
fn make_certs(dir: &Path) -> TlsFiles {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=idmig-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &ca);
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
        ),
        (
            "client",
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        ),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        let mut req = vec!["req"];
        req.extend(ec);
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.crt");
        let extf = format!("{name}.ext");
        // The client certificate names the read-only user, so that whichever way etcd
        // authenticates (certificate CN or password) it is that user.
        let subject = if name == "client" {
            "/CN=idmig"
        } else {
            "/CN=etcd"
        };
        req.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &extf,
            ],
        );
    }
    TlsFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join("client.crt"),
        key: dir.join("client.key"),
    }
}

/// Writes the dataset into etcd under `prefix` (master keys and one `value/` key per node
/// using each identity), in transactions of at most 128 operations. For tests and benchmarks:
/// the product never writes to etcd, which is why this lives here and not in the library.
pub async fn load_etcd(client: &mut etcd_client::Client, prefix: &str, data: &Generated) {
    let mut ops: Vec<etcd_client::TxnOp> = Vec::new();
    let puts = data.kvstore_keys(prefix, |node| {
        format!("10.0.{}.{}", node / 250, node % 250 + 1)
    });
    for (k, v) in puts {
        ops.push(etcd_client::TxnOp::put(k, v, None));
        if ops.len() == 128 {
            commit(client, std::mem::take(&mut ops)).await;
        }
    }
    if !ops.is_empty() {
        commit(client, ops).await;
    }
}

async fn commit(client: &mut etcd_client::Client, ops: Vec<etcd_client::TxnOp>) {
    client
        .txn(etcd_client::Txn::new().and_then(ops))
        .await
        .expect("loading the dataset into the test etcd");
}

/// What one played rollout did: the simulated agents' allocations, how far the two backends
/// diverged, and the split allocations sync reported.
pub struct PlayedRollout {
    pub counts: cilium_idmig::sandbox::rollout::RolloutCounts,
    pub divergence: cilium_idmig::sandbox::rollout::Divergence,
    pub reported_splits: usize,
    /// Splits at ids Kubernetes held (and the kvstore did not) when sync started.
    pub splits_at_held_ids: usize,
    pub cutover: bool,
    pub took: Duration,
}

/// What sync in-process runs on: the demo world's kvstore and sandbox, cluster 0's range,
/// its decision log at `log` (its session line naming `command`), reserving in the kvstore
/// with `reserve`.
pub fn sync_config(
    world: &cilium_idmig::sandbox::demo::DemoWorld,
    (log, command): (&std::path::Path, &'static str),
    reserve: bool,
) -> std::sync::Arc<cilium_idmig::app::config::ServiceConfig> {
    use cilium_idmig::io::decision_log::DecisionLog;
    use cilium_idmig::io::k8s::K8sTarget;
    use std::sync::Arc;
    Arc::new(cilium_idmig::app::config::ServiceConfig {
        kv: world.kv_source(),
        target: K8sTarget::from_url(&world.sandbox.url()).expect("target"),
        scope: cilium_idmig::core::range::ClusterScope::new(0, Default::default()).expect("scope"),
        log: Arc::new(DecisionLog::open(log).expect("log")),
        apply: cilium_idmig::apply::executor::ApplyOptions::default(),
        command,
        resume: Vec::new(),
        sync_reserve_in_kvstore: reserve,
        cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
    })
}

/// Plays the demo's rollout (`identities` generated, `nodes` kvstore-mode nodes moving to CRD
/// mode at `speed`) with sync following it in-process (every proposal accepted, until
/// cutover), with or without `--reserve-in-kvstore`.
pub async fn play_rollout(
    identities: usize,
    nodes: u32,
    speed: f64,
    seed: u64,
    reserve: bool,
) -> PlayedRollout {
    use std::sync::Arc;

    use cilium_idmig::app::metrics::Metrics;
    use cilium_idmig::app::sync::{self, SyncEvent, SyncOptions};
    use cilium_idmig::apply::executor::StopFlag;
    use cilium_idmig::sandbox::demo::{self, DemoConfig};
    use cilium_idmig::sandbox::rollout::{self, RolloutConfig};

    let world = demo::world(DemoConfig {
        identities,
        seed,
        nodes,
        ..Default::default()
    })
    .await
    .expect("demo world");
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = sync_config(&world, (&dir.path().join("sync.jsonl"), "rollout"), reserve);
    // Ids Kubernetes holds and the kvstore does not when sync starts: with reservations,
    // no kvstore-mode agent may ever hand one out for other labels.
    let kv_ids: std::collections::BTreeSet<u32> = world
        .kv
        .snapshot(cilium_idmig::core::kvstore::DEFAULT_PREFIX)
        .masters
        .iter()
        .filter_map(|m| cilium_idmig::core::kvstore::parse_id(&m.id).ok())
        .collect();
    let k8s_only: std::collections::BTreeSet<u32> = world
        .sandbox
        .agent()
        .identities()
        .into_keys()
        .filter(|id| !kv_ids.contains(id))
        .collect();
    let (rollout_tx, mut rollout_rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move { while rollout_rx.recv().await.is_some() {} });
    let rollout = tokio::spawn(rollout::run(
        world.kv.clone(),
        world.sandbox.agent(),
        world.leases.clone(),
        RolloutConfig {
            speed,
            seed,
            // A narrow pool: the two blind allocators collide often, which is what the
            // tests and the benchmark of reservations measure.
            pool: 8,
            ..Default::default()
        },
        rollout_tx,
    ));
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let splits = tokio::spawn(async move {
        let mut n = 0;
        while let Some(ev) = rx.recv().await {
            if matches!(ev, SyncEvent::Split(_)) {
                n += 1;
            }
        }
        n
    });
    let start = Instant::now();
    let opts = SyncOptions {
        accept_proposals: true,
        until_cutover: true,
        reserve_in_kvstore: reserve,
        ..Default::default()
    };
    let end = sync::run(
        cfg,
        opts,
        Arc::new(Metrics::new().expect("metrics")),
        tx,
        StopFlag::default(),
        None,
    )
    .await
    .expect("sync");
    let took = start.elapsed();
    let counts = rollout.await.expect("rollout");
    let divergence = rollout::divergence(&world.kv, &world.sandbox.agent());
    let splits_at_held_ids = divergence
        .splits
        .iter()
        .filter(|id| k8s_only.contains(id))
        .count();
    PlayedRollout {
        counts,
        divergence,
        reported_splits: splits.await.expect("splits"),
        splits_at_held_ids,
        cutover: end.cutover,
        took,
    }
}

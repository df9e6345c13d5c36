//! A real Kubernetes control plane for tests and benchmarks, the way Kubernetes projects use
//! envtest: `KUBEBUILDER_ASSETS` names a folder holding `kube-apiserver` (and `etcd`, else
//! etcd from the PATH), or `KUBE_APISERVER` the binary itself; `CONTROL_PLANE` names the
//! script that starts it with a throwaway PKI, free loopback ports and both Cilium CRDs
//! (`scripts/test` sets all of them from the team's shared control plane when it is there).
//! Where any is missing, a test says plainly that it was skipped and why (on stderr, and in
//! the file `IDMIG_SKIPS` names, which the closing line of `scripts/test` counts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

/// A running kube-apiserver with its own etcd, stopped on drop.
pub struct ControlPlane {
    script: PathBuf,
    dir: TempDir,
    /// The admin's kubeconfig (system:masters).
    pub kubeconfig: PathBuf,
    /// The kubeconfig of `limited-user`, who has no RBAC at all until a test grants some.
    pub kubeconfig_user: PathBuf,
    pub url: String,
}

/// Records that `test` was skipped and why: on stderr (`cargo test -- --nocapture` shows
/// it), and as a line of the file `IDMIG_SKIPS` names, for the suite's closing line.
pub fn skip(test: &str, why: &str) {
    note("IDMIG_SKIPS", &format!("skipped: {test}: {why}"));
}

/// `line` on stderr, and appended to the file the variable `var` names (if set).
fn note(var: &str, line: &str) {
    eprintln!("{line}");
    if let Ok(path) = std::env::var(var) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Where the real server is, or why it is not there.
fn locate() -> Result<PathBuf, String> {
    let assets = std::env::var("KUBEBUILDER_ASSETS").ok();
    let apiserver = std::env::var("KUBE_APISERVER")
        .ok()
        .or_else(|| assets.map(|a| format!("{a}/kube-apiserver")));
    let Some(apiserver) = apiserver else {
        return Err("no real kube-apiserver: set KUBEBUILDER_ASSETS (a folder with kube-apiserver) or KUBE_APISERVER; scripts/test sets them from the shared control plane".into());
    };
    if !Path::new(&apiserver).is_file() {
        return Err(format!("no kube-apiserver at {apiserver}"));
    }
    let script = std::env::var("CONTROL_PLANE")
        .map_err(|_| "CONTROL_PLANE (the script that starts the control plane) is not set")?;
    if !Path::new(&script).is_file() {
        return Err(format!("no control-plane script at {script}"));
    }
    Ok(PathBuf::from(script))
}

/// A binary of the shared control plane's (Cilium's own code: `allocsim-1.18`,
/// `cilium-1.6.11`), from `KUBEBUILDER_ASSETS`; or why it is not there.
pub fn cilium_bin(name: &str) -> Result<PathBuf, String> {
    let assets = std::env::var("KUBEBUILDER_ASSETS")
        .map_err(|_| format!("no {name}: KUBEBUILDER_ASSETS is not set"))?;
    let path = Path::new(&assets).join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("no {name} in {assets}"))
    }
}

/// Records that `test` ran on the real server `version` (`APISERVER_VERSION`, and which
/// etcd beneath it): on stderr, and as a line of the file `IDMIG_SERVERS` names, which
/// `scripts/test` prints beside the closing line so the run says which servers it proved.
pub fn ran_on(test: &str, version: &str, etcd: &str) {
    note(
        "IDMIG_SERVERS",
        &format!("ran: {test} on kube-apiserver {version} over etcd {etcd}"),
    );
}

impl ControlPlane {
    /// Starts one (the release `KUBE_VERSION` names, 1.19 by default, as the script does),
    /// or says why `test` is skipped and returns `None`.
    pub fn start(test: &str) -> Option<ControlPlane> {
        Self::start_with(test, &[])
    }

    /// Starts one with these variables set for the script (`KUBE_VERSION`, `ETCD`,
    /// `EXTRA_APISERVER_FLAGS`), or says why `test` is skipped.
    pub fn start_with(test: &str, vars: &[(&str, &str)]) -> Option<ControlPlane> {
        let script = match locate() {
            Ok(s) => s,
            Err(why) => {
                skip(test, &why);
                return None;
            }
        };
        // The script picks free ports by binding and letting go: another server starting
        // at the same moment can take one first, and its etcd then never comes up. A start
        // that fails so is tried again on fresh ports (the failed one stopped), twice at most.
        let mut attempt = 0;
        let mut cp = loop {
            attempt += 1;
            let dir = tempfile::tempdir().unwrap();
            let out = Command::new(&script)
                .arg("start")
                .arg(dir.path())
                .envs(vars.iter().copied())
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let cp = ControlPlane {
                script: script.clone(),
                kubeconfig: dir.path().join("kubeconfig"),
                kubeconfig_user: dir.path().join("kubeconfig-limited"),
                url: String::new(),
                dir,
            };
            if out.status.success() {
                break cp;
            }
            let why = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(
                attempt < 3 && why.contains("did not start"),
                "the control plane did not start (attempt {attempt}): {why}\n{}",
                std::fs::read_to_string(cp.dir.path().join("apiserver.log")).unwrap_or_default()
            );
            eprintln!(
                "{test}: the control plane did not start ({}); once more",
                why.trim()
            );
            drop(cp);
            std::thread::sleep(std::time::Duration::from_secs(1));
        };
        cp.url = cp.env()["APISERVER_URL"].clone();
        let version = cp.version();
        let etcd = match vars.iter().find(|(k, _)| *k == "ETCD") {
            Some(_) => "3.4 (Debian's)",
            None if version.starts_with("v1.19") => "3.4",
            None => "3.6",
        };
        ran_on(test, &version, etcd);
        Some(cp)
    }

    /// The release running (`v1.19.0`, `v1.36.2`).
    pub fn version(&self) -> String {
        self.env()
            .get("APISERVER_VERSION")
            .cloned()
            .unwrap_or_default()
    }

    /// A kube client for the admin's kubeconfig (the benchmarks'; the tests use kubectl).
    #[allow(dead_code)]
    pub async fn client(&self) -> kube::Client {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig"),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("config");
        kube::Client::try_from(config).expect("client")
    }

    /// The cluster CA's certificate (what a pod finds as `ca.crt` beside its token).
    pub fn ca_file(&self) -> PathBuf {
        PathBuf::from(&self.env()["CA_FILE"])
    }

    /// What the script wrote to `DIR/env`.
    fn env(&self) -> BTreeMap<String, String> {
        std::fs::read_to_string(self.dir.path().join("env"))
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// kubectl as the admin; panics with its output when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_as(&self.kubeconfig, args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON) as the admin.
    pub fn apply(&self, manifest: &str) {
        let out = self.kubectl_as(&self.kubeconfig, &["apply", "-f", "-"], Some(manifest));
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{manifest}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl (Debian's kubernetes-client)");
        let mut input = child.stdin.take().unwrap();
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// Creates a `CiliumIdentity` as a CRD-mode agent does (name = id).
    pub fn create_identity(&self, id: u32, security_labels: &BTreeMap<String, String>) {
        let obj = serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumIdentity",
            "metadata": {"name": id.to_string()},
            "security-labels": security_labels,
        });
        let out = self.kubectl_as(
            &self.kubeconfig,
            &["create", "-f", "-"],
            Some(&obj.to_string()),
        );
        assert!(
            out.status.success(),
            "create {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every `CiliumIdentity`: name -> its `security-labels`.
    pub fn identities(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let list: serde_json::Value =
            serde_json::from_str(&self.kubectl(&["get", "ciliumidentities", "-o", "json"]))
                .unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let name = o["metadata"]["name"].as_str().unwrap().to_string();
                let labels = serde_json::from_value(o["security-labels"].clone()).unwrap();
                (name, labels)
            })
            .collect()
    }
}

/// A second kube-apiserver on the control plane's etcd: an HA peer with a watch cache of its
/// own. Killed on drop.
pub struct Peer {
    child: std::process::Child,
    /// The admin's kubeconfig, pointing at this peer.
    pub kubeconfig: PathBuf,
    pub url: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ControlPlane {
    /// The API server's command line as the script started it.
    fn apiserver_argv(&self) -> Vec<String> {
        let pid = &self.env()["APISERVER_PID"];
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap()
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    /// Starts `argv` with its output to `log`, detached from the test's process group.
    fn spawn_apiserver(&self, argv: &[String], log: &str) -> std::process::Child {
        let out = std::fs::File::create(self.dir.path().join(log)).unwrap();
        Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap()
    }

    /// Waits until the API server behind `kubeconfig` answers `/readyz`.
    fn wait_ready(&self, kubeconfig: &Path, log: &str) {
        let start = std::time::Instant::now();
        loop {
            let out = self.kubectl_as(kubeconfig, &["get", "--raw", "/readyz"], None);
            if out.status.success() {
                return;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(90),
                "kube-apiserver not ready: {}",
                std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    /// Restarts the API server alone (killed, then started again on the same port and
    /// etcd): its watch cache starts empty, so a watch from an older resourceVersion gets
    /// 410 Gone. Returns when it is ready again.
    pub fn restart_apiserver(&self) {
        let argv = self.apiserver_argv();
        let env = self.env();
        let pid = &env["APISERVER_PID"];
        let _ = Command::new("kill").args(["-9", pid]).status();
        while Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let child = self.spawn_apiserver(&argv, "apiserver-restarted.log");
        // The script's `stop` kills the process `env` names.
        let text = std::fs::read_to_string(self.dir.path().join("env")).unwrap();
        let text = text.replace(
            &format!("APISERVER_PID={pid}"),
            &format!("APISERVER_PID={}", child.id()),
        );
        std::fs::write(self.dir.path().join("env"), text).unwrap();
        std::mem::forget(child);
        self.wait_ready(&self.kubeconfig, "apiserver-restarted.log");
    }

    /// Starts an HA peer: the same API server on another port, on the same etcd.
    pub fn start_peer(&self) -> Peer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cert_dir = self.dir.path().join("certdir-peer");
        let argv: Vec<String> = self
            .apiserver_argv()
            .into_iter()
            .map(|a| {
                if a.starts_with("--secure-port=") {
                    format!("--secure-port={port}")
                } else if a.starts_with("--cert-dir=") {
                    format!("--cert-dir={}", cert_dir.display())
                } else {
                    a
                }
            })
            .collect();
        let child = self.spawn_apiserver(&argv, "apiserver-peer.log");
        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = self.dir.path().join("kubeconfig-peer");
        let text = std::fs::read_to_string(&self.kubeconfig)
            .unwrap()
            .replace(&self.url, &url);
        std::fs::write(&kubeconfig, text).unwrap();
        let peer = Peer {
            child,
            kubeconfig,
            url,
        };
        self.wait_ready(&peer.kubeconfig, "apiserver-peer.log");
        peer
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

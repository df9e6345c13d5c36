//! Test harness: a real etcd on a free loopback port with a temp data dir (plain or TLS
//! with client certificates), a raw HTTP/1.1 client, and helpers to run the real binary.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

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
        let etcd = Etcd {
            child,
            dir,
            endpoint: client_url,
            tls: tls_files,
        };
        etcd.wait_ready().await;
        etcd
    }

    async fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            if let Ok(mut c) = self.client().await
                && c.status().await.is_ok()
            {
                return;
            }
            let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "etcd did not become ready:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client for seeding test data (the tool itself never writes to etcd).
    pub async fn client(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        let mut opts =
            etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
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
        req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=root"]);
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

/// A raw HTTP/1.1 exchange (`Connection: close`), independent of the product's client.
pub async fn http(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (code, headers, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cilium-idmig")
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary without blocking the runtime (the sandbox keeps serving meanwhile).
pub async fn run(dir: &Path, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(bin())
        .current_dir(dir)
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

//! Test harness: the real etcd from the shared test support, a raw HTTP/1.1 client, and
//! helpers to run the real binary.

use std::path::Path;

pub use crate::support::{Etcd, free_port, load_etcd};

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

/// A tmux server of the test's own (its own socket), running one command in a 100x30 pane.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn start(name: &str, cmd: &str) -> Tmux {
        let t = Tmux {
            socket: format!("idmig-{name}-{}", std::process::id()),
        };
        let ok = std::process::Command::new("tmux")
            .args([
                "-L",
                &t.socket,
                "new-session",
                "-d",
                "-x",
                "100",
                "-y",
                "30",
                "-s",
                "t",
                cmd,
            ])
            .status()
            .expect("tmux is needed for this test (apt-get install tmux)");
        assert!(ok.success());
        t
    }

    pub fn cmd(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends keys one at a time, as a person types.
    pub fn keys(&self, keys: &[&str]) {
        for k in keys {
            self.cmd(&["send-keys", "-t", "t", k]);
            std::thread::sleep(std::time::Duration::from_millis(60));
        }
    }

    pub fn screen(&self) -> String {
        self.cmd(&["capture-pane", "-p", "-t", "t"])
    }

    pub fn alternate_on(&self) -> String {
        self.cmd(&["display", "-p", "-t", "t", "#{alternate_on}"])
            .trim()
            .to_string()
    }

    pub fn wait_for(&self, text: &str, secs: u64) -> String {
        let start = std::time::Instant::now();
        loop {
            let s = self.screen();
            if s.contains(text) {
                return s;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(secs),
                "waited for {text:?}; screen:\n{s}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.cmd(&["kill-server"]);
    }
}

/// Generates a dataset and writes its kvstore side into `etcd` under Cilium's prefix.
pub async fn load_dataset(
    etcd: &Etcd,
    identities: usize,
    seed: u64,
    nodes: u32,
) -> cilium_idmig::sandbox::generator::Generated {
    use cilium_idmig::sandbox::generator::{self, GenConfig};
    let data = generator::generate(&GenConfig {
        identities,
        seed,
        nodes,
        ..Default::default()
    })
    .unwrap();
    let mut c = etcd.client().await.unwrap();
    load_etcd(&mut c, cilium_idmig::core::kvstore::DEFAULT_PREFIX, &data).await;
    data
}

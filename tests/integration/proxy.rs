//! A TCP proxy between the binary under test and one of its servers, to fail the network
//! the way production does: `Stall` keeps every connection open and forwards nothing from
//! then on (a dead peer behind NAT, a load balancer that stopped forwarding), new
//! connections included; `Down` drops every connection and every new one (the server is
//! gone); `Forward` forwards again, for new connections: a stalled one stays dead, as a
//! half-open connection does.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Forward,
    Stall,
    Down,
}

pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped by `kill_existing`: connections opened before stall, new ones forward.
    epoch: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port and forwards to `target` ("host:port" or a URL).
    pub(crate) async fn start(target: &str) -> Proxy {
        let target: SocketAddr = target
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .expect("a proxy target host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, rx) = watch::channel(Mode::Forward);
        let (epoch, epochs) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        let now = *rx.borrow();
                        match now {
                            Mode::Down => drop(client),
                            _ => {
                                let (mode, epochs) = (rx.clone(), epochs.clone());
                                conns.spawn(pipe(client, target, mode, epochs));
                            }
                        }
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Proxy {
            addr,
            mode,
            epoch,
            task,
        }
    }

    /// Every connection open now goes dead without closing (a load balancer that went
    /// half-open): held open, nothing carried, for ever. Connections opened later forward.
    pub(crate) fn kill_existing(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    pub(crate) fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards one connection until either side closes, the proxy goes down, or it stalls
/// (then it holds both sockets open and moves nothing, for ever).
async fn pipe(
    mut client: TcpStream,
    target: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    mut epochs: watch::Receiver<u64>,
) {
    let now = *mode.borrow_and_update();
    epochs.borrow_and_update();
    if now == Mode::Stall {
        // Held open, never read.
        let _held = &client;
        std::future::pending::<()>().await;
    }
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            n = cr.read(&mut up) => match n {
                Ok(n) if n > 0 => if sw.write_all(&up[..n]).await.is_err() { return },
                _ => return,
            },
            n = sr.read(&mut down) => match n {
                Ok(n) if n > 0 => if cw.write_all(&down[..n]).await.is_err() { return },
                _ => return,
            },
            _ = epochs.changed() => std::future::pending::<()>().await,
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *mode.borrow_and_update();
                match now {
                    Mode::Down => return,
                    Mode::Stall => std::future::pending::<()>().await,
                    Mode::Forward => {}
                }
            }
        }
    }
}

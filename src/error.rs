//! The library's error type: every variant names the thing that failed and what to do about it,
//! and keeps the underlying error as its `source` so the chain survives for logs and callers.

use std::path::PathBuf;

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Any underlying error kept as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Each message already reads as one operator-facing line (it quotes its cause), so front
/// ends print the `Display` alone; `source()` holds the cause itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("etcd at {endpoints}: {message}")]
    Etcd {
        endpoints: String,
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("Kubernetes API server {server}: {message}")]
    Kube {
        server: String,
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("kubeconfig: {message}")]
    Kubeconfig {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("{path}: {message}")]
    File {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("plan file {path}: {message}")]
    PlanFile { path: PathBuf, message: String },

    #[error("plan item {id}: {reason}")]
    PlanItem { id: String, reason: String },

    #[error("{0}")]
    Config(String),

    #[error("{0}")]
    Refused(String),

    #[error("sandbox API server: {message}")]
    Sandbox {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("terminal: {message}")]
    Terminal {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
}

/// The innermost cause of an error, and whether it says the server could not be reached.
/// Network clients nest their transport errors several levels deep, in debug form at the top
/// (`grpc request error: ... ConnectError(...)`); the bottom reads as one plain line
/// (`Connection refused (os error 111)`).
pub(crate) fn root_cause(cause: &(dyn std::error::Error + 'static)) -> (String, bool) {
    let mut root = cause;
    while let Some(next) = root.source() {
        root = next;
    }
    let unreachable = root.downcast_ref::<std::io::Error>().is_some_and(|io| {
        matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::HostUnreachable
                | std::io::ErrorKind::NetworkUnreachable
        )
    });
    let text = root.to_string();
    // Some clients keep only the text of the transport error.
    let unreachable = unreachable
        || ["lookup address", "Connection refused", "connection refused"]
            .iter()
            .any(|t| text.contains(t));
    (text, unreachable)
}

/// What to check when etcd's client fails in a way that says the endpoint is not what was
/// meant: something that is not etcd's client port (an API server, a peer port) breaks the
/// gRPC stream; a plain-http etcd named with https ends the TLS handshake at once.
fn etcd_hint(root: &str) -> Option<&'static str> {
    let has = |words: &[&str]| words.iter().any(|w| root.to_lowercase().contains(w));
    if has(&[
        "tls handshake eof",
        "invalidcontenttype",
        "corrupt message",
        "wrong version number",
    ]) {
        Some(
            "the endpoint does not answer TLS: if etcd listens on plain http, name it http://, not https://",
        )
    } else if has(&[
        "broken pipe",
        "stream closed",
        "h2 protocol error",
        "frame with invalid size",
        "http2 error",
    ]) {
        Some(
            "is it etcd's client URL (port 2379 by default)? Another server there (the API server, an etcd peer port) answers etcd's gRPC this way",
        )
    } else {
        None
    }
}

/// `"{what}: {innermost cause}"`, with `unreachable_hint` when the server could not be
/// reached at all, and the cause kept as the source.
fn server_failure(
    what: &str,
    cause: impl Into<BoxError>,
    unreachable_hint: &str,
) -> (String, Option<BoxError>) {
    let cause = cause.into();
    let (root, unreachable) = root_cause(cause.as_ref());
    let message = if unreachable {
        format!("{what}: {root}; {unreachable_hint}")
    } else {
        format!("{what}: {root}")
    };
    (message, Some(cause))
}

/// `"{what}: {cause}"`, and the cause kept as the source.
fn with_cause(what: &str, cause: impl Into<BoxError>) -> (String, Option<BoxError>) {
    let cause = cause.into();
    (format!("{what}: {cause}"), Some(cause))
}

impl Error {
    /// A problem with a named file that has no underlying error (a refusal, a bad format).
    pub fn file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Error::File {
            path: path.into(),
            message: message.to_string(),
            source: None,
        }
    }

    /// An IO (or parse) error on a named file: `what` says what the tool was doing.
    pub fn file_io(path: impl Into<PathBuf>, what: &str, cause: impl Into<BoxError>) -> Self {
        let (message, source) = with_cause(what, cause);
        Error::File {
            path: path.into(),
            message,
            source,
        }
    }

    /// An IO error on a named file, worded by the cause alone.
    pub fn file_cause(path: impl Into<PathBuf>, cause: impl Into<BoxError>) -> Self {
        let cause = cause.into();
        Error::File {
            path: path.into(),
            message: cause.to_string(),
            source: Some(cause),
        }
    }

    /// An etcd failure, worded by its innermost cause (see `server_failure`).
    pub fn etcd(endpoints: impl Into<String>, what: &str, cause: impl Into<BoxError>) -> Self {
        let cause = cause.into();
        let (root, _) = root_cause(cause.as_ref());
        let (mut message, source) = server_failure(
            what,
            cause,
            "check that etcd is up and that --etcd-endpoints (or --etcd-config) names it",
        );
        if let Some(hint) = etcd_hint(&root) {
            message = format!("{message}; {hint}");
        }
        Error::Etcd {
            endpoints: endpoints.into(),
            message,
            source,
        }
    }

    /// A Kubernetes API failure, worded like `etcd`'s.
    pub fn kube(server: impl Into<String>, what: &str, cause: impl Into<BoxError>) -> Self {
        let (message, source) = server_failure(
            what,
            cause,
            "check that the API server is up and that --kubeconfig (or --context) names it",
        );
        Error::Kube {
            server: server.into(),
            message,
            source,
        }
    }

    /// A kubeconfig problem; `hint` (may be empty) follows the cause, e.g. what to pass instead.
    pub fn kubeconfig(context: Option<&str>, cause: impl Into<BoxError>, hint: &str) -> Self {
        let cause = cause.into();
        let message = match context {
            Some(c) => format!("{c}: {cause}{hint}"),
            None => format!("{cause}{hint}"),
        };
        Error::Kubeconfig {
            message,
            source: Some(cause),
        }
    }

    pub fn sandbox(what: &str, cause: impl Into<BoxError>) -> Self {
        let cause = cause.into();
        let message = match what {
            "" => cause.to_string(),
            w => format!("{w}: {cause}"),
        };
        Error::Sandbox {
            message,
            source: Some(cause),
        }
    }

    pub fn terminal(cause: impl Into<BoxError>) -> Self {
        let cause = cause.into();
        Error::Terminal {
            message: cause.to_string(),
            source: Some(cause),
        }
    }

    /// Whether this error is the operator's to fix (exit 2) rather than a failed operation (exit 1).
    pub fn is_usage(&self) -> bool {
        match self {
            Error::Kubeconfig { .. }
            | Error::PlanFile { .. }
            | Error::PlanItem { .. }
            | Error::Config(_)
            | Error::Refused(_)
            | Error::File { .. } => true,
            // A server's failure is failed work unless the server refused these
            // credentials or this request (`io::refusal` tells, for the exit code).
            _ => false,
        }
    }
}

#[cfg(test)]
mod etcd_hint_tests {
    #[test]
    fn an_endpoint_that_is_not_etcd_or_not_tls_says_what_to_check() {
        let e = super::Error::etcd(
            "https://127.0.0.1:2379",
            "range request",
            std::io::Error::other("tls handshake eof"),
        );
        assert!(e.to_string().contains("name it http://"), "{e}");
        let e = super::Error::etcd(
            "http://127.0.0.1:6443",
            "range request",
            std::io::Error::other("stream closed because of a broken pipe"),
        );
        assert!(e.to_string().contains("etcd's client URL"), "{e}");
        let e = super::Error::etcd(
            "http://x",
            "range request",
            std::io::Error::other("key not found"),
        );
        assert!(!e.to_string().contains("client URL"), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_unreachable_etcd_names_the_innermost_cause_and_what_to_check() {
        #[derive(Debug, thiserror::Error)]
        #[error(
            "grpc request error: status: Unavailable, message: \"tcp connect error\", details: [] ..."
        )]
        struct Nested(#[source] std::io::Error);
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = Error::etcd("http://127.0.0.1:1", "range request", Nested(io));
        assert_eq!(
            e.to_string(),
            "etcd at http://127.0.0.1:1: range request: Connection refused; check that etcd is up and that --etcd-endpoints (or --etcd-config) names it"
        );
        assert!(e.source().is_some());
    }

    #[test]
    fn messages_stay_one_line_and_keep_their_source() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = Error::file_io("/x/log.jsonl", "cannot open decision log", io);
        assert_eq!(
            e.to_string(),
            "/x/log.jsonl: cannot open decision log: denied"
        );
        let src = e.source().expect("the io error is kept");
        assert_eq!(src.to_string(), "denied");
        let e = Error::etcd("http://127.0.0.1:1", "cannot connect", "refused");
        assert_eq!(
            e.to_string(),
            "etcd at http://127.0.0.1:1: cannot connect: refused"
        );
        assert!(e.source().is_some());
        assert!(Error::file("/p", "already exists").source().is_none());
    }
}

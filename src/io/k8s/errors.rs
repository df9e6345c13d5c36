//! How a request to the API server failed, classified for retries and decisions: its
//! status, reason and `Retry-After` as the server sent them, a plain-text body told apart
//! from a `Status`, and kube's own errors mapped to the same.

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

/// A failed request, classified for retry decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The server answered with an error status.
    Status {
        code: u16,
        /// The body was not a `Status` object (e.g. a plain-text `404 page not found`
        /// for a resource path that is not served).
        plain: bool,
        reason: String,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The connection failed or was dropped before a response.
    Transport(String),
    /// No answer within the per-operation timeout.
    Timeout,
}

impl RequestError {
    /// 429, 5xx, dropped connections and timeouts are worth another try; 4xx are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            RequestError::Status { code, .. } => *code == 429 || *code >= 500,
            RequestError::Transport(_) | RequestError::Timeout => true,
        }
    }

    /// The server pushed back (429 Too Many Requests: API Priority and Fairness, or
    /// `--max-requests-inflight`): a wait, not a failure.
    pub fn is_throttled(&self) -> bool {
        matches!(self, RequestError::Status { code: 429, .. })
    }

    /// The connection was refused: nothing listens at the server's address.
    pub fn is_refused(&self) -> bool {
        matches!(self, RequestError::Transport(m)
            if m.contains("Connection refused") || m.contains("os error 111"))
    }

    /// Whether a read is worth another try, given whether this server ever answered. A server
    /// that refuses the very first connection is not there (a wrong address, a stopped
    /// server): retrying only delays the error, as etcd's client fails at once. Once it has
    /// answered, a refusal is a restart or an outage, which a retry outlives.
    pub fn worth_retrying(&self, answered_before: bool) -> bool {
        self.is_retryable() && (answered_before || !self.is_refused())
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RequestError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// AlreadyExists, recognised by code as well as reason.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, RequestError::Status { code: 409, .. })
            || matches!(self, RequestError::Status { reason, .. } if reason == "AlreadyExists")
    }

    /// NotFound for an object: a 404 Status, by code or by reason. A plain-text 404 means the
    /// resource itself is not served (yet), which is not the same thing.
    /// A 409 Conflict (not AlreadyExists): a precondition (uid, resourceVersion) did not hold.
    /// The HTTP status, when the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            RequestError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, RequestError::Status { code: 409, reason, .. } if reason != "AlreadyExists")
    }

    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            RequestError::Status {
                code: 404,
                plain: false,
                ..
            }
        ) || matches!(self, RequestError::Status { reason, .. } if reason == "NotFound")
    }

    /// Any 404, including a plain-text one for a path that is not served.
    pub fn is_404(&self) -> bool {
        matches!(self, RequestError::Status { code: 404, .. })
    }
}

impl std::error::Error for RequestError {}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Status {
                code,
                reason,
                message,
                ..
            } => {
                write!(f, "HTTP {code}")?;
                if !reason.is_empty() {
                    write!(f, " {reason}")?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            RequestError::Transport(e) => write!(f, "connection failed: {e}"),
            RequestError::Timeout => write!(f, "timed out"),
        }
    }
}

/// The error an ERROR event carries (a `Status`).
pub(super) fn status_of(o: crate::io::list_stream::EventObject) -> RequestError {
    RequestError::Status {
        code: o.code.unwrap_or(500),
        plain: false,
        reason: o.reason.unwrap_or_default(),
        message: o.message.unwrap_or_default(),
        retry_after: None,
    }
}

/// The error for a non-success answer: its Status when the body is one, else the plain text.
pub(super) fn status_error(
    status: StatusCode,
    body: &[u8],
    retry_after: Option<Duration>,
) -> RequestError {
    {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        // A Status body when there is one; the plain text otherwise (e.g. "404 page not found"
        // while a new CRD is not yet established).
        let plain = value.get("kind").and_then(Value::as_str) != Some("Status");
        let (reason, message) = if !plain {
            (
                value
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                value
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            )
        } else {
            (
                String::new(),
                String::from_utf8_lossy(body)
                    .trim()
                    .chars()
                    .take(200)
                    .collect(),
            )
        };
        RequestError::Status {
            code: status.as_u16(),
            plain,
            reason,
            message,
            retry_after,
        }
    }
}

/// One call through kube's typed `Api`, with a deadline, its error classified like every
/// other request's (status, reason; a transport failure by its root cause).
pub(crate) async fn kube_call<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, RequestError> {
    match tokio::time::timeout(deadline, call).await {
        Err(_) => Err(RequestError::Timeout),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) => {
            // kube's stand-in for a body that was not a Status (e.g. `404 page not found`
            // for a resource not served yet).
            let plain = s.reason == "Failed to parse error data";
            Err(RequestError::Status {
                code: s.code,
                plain,
                reason: if plain {
                    String::new()
                } else {
                    s.reason.clone()
                },
                message: s.message.clone(),
                retry_after: s
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|secs| *secs > 0)
                    .map(|secs| Duration::from_secs(u64::from(secs))),
            })
        }
        Ok(Err(e)) => Err(RequestError::Transport(crate::error::root_cause(&e).0)),
    }
}

#[cfg(test)]
mod tests {
    use super::RequestError;

    #[test]
    fn a_refusal_before_any_answer_is_not_retried_and_one_after_is() {
        let refused = RequestError::Transport("Connection refused (os error 111)".into());
        assert!(refused.is_refused());
        assert!(
            !refused.worth_retrying(false),
            "nothing listens there: fail at once"
        );
        assert!(
            refused.worth_retrying(true),
            "a restart or an outage: retry"
        );
        // Other transient failures are retried either way; a 4xx never.
        let reset = RequestError::Transport("connection reset by peer".into());
        assert!(reset.worth_retrying(false) && reset.worth_retrying(true));
        assert!(RequestError::Timeout.worth_retrying(false));
        let busy = RequestError::Status {
            code: 503,
            plain: true,
            reason: String::new(),
            message: String::new(),
            retry_after: None,
        };
        assert!(busy.worth_retrying(false));
        let denied = RequestError::Status {
            code: 403,
            plain: false,
            reason: "Forbidden".into(),
            message: String::new(),
            retry_after: None,
        };
        assert!(!denied.worth_retrying(true));
    }
}

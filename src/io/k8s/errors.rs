//! How a request to the API server failed, classified for retries and decisions: its
//! status, reason and `Retry-After` as the server sent them, a plain-text body told apart
//! from a `Status`, and kube's own errors mapped to the same.

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

pub use crate::core::request::RequestError;

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

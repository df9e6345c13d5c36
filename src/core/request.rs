//! How a request to the API server failed, as plain data classified for the rules that
//! decide what a failure means: retried, waited out (429), a refusal of these credentials
//! (401, 403: configuration), or one object denied by an admission webhook or policy.

use std::time::Duration;

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

impl RequestError {
    /// The server's answer with a `Status` body of `code`, `reason` and `message`.
    pub fn status(code: u16, reason: &str, message: impl Into<String>) -> Self {
        RequestError::Status {
            code,
            plain: false,
            reason: reason.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// An admission webhook or a ValidatingAdmissionPolicy denied this one object (the code
    /// is the one it chose, 400 by default): that object's outcome, not the credentials'.
    pub fn is_denial(&self) -> bool {
        match self {
            RequestError::Status {
                code,
                plain: false,
                message,
                ..
            } if (400..500).contains(code) => {
                message.contains("admission webhook")
                    || message.contains("ValidatingAdmissionPolicy")
                    || message.contains("denied the request")
                    || message.contains("denied request")
            }
            _ => false,
        }
    }

    /// The server refused these credentials or this verb (401, or a 403 that no admission
    /// check chose): configuration to fix, never an outage to wait out.
    pub fn is_refusal(&self) -> bool {
        matches!(self.code(), Some(401 | 403)) && !self.is_denial()
    }
}

#[cfg(test)]
mod tests {
    use super::RequestError;

    fn status(code: u16, reason: &str, message: &str) -> RequestError {
        RequestError::status(code, reason, message)
    }

    #[test]
    fn rbac_is_a_refusal_and_an_admission_check_is_a_denial_of_one_object() {
        let rbac = status(
            403,
            "Forbidden",
            "ciliumidentities.cilium.io is forbidden: User \"idmig\" cannot create resource \"ciliumidentities\" in API group \"cilium.io\" at the cluster scope",
        );
        assert!(rbac.is_refusal() && !rbac.is_denial());
        assert!(status(401, "Unauthorized", "Unauthorized").is_refusal());
        let webhook = status(
            403,
            "Forbidden",
            "admission webhook \"deny.example.com\" denied the request: id 300 is reserved",
        );
        assert!(webhook.is_denial() && !webhook.is_refusal());
        let default_code = status(
            400,
            "BadRequest",
            "admission webhook \"deny.example.com\" denied the request without explanation",
        );
        assert!(default_code.is_denial() && !default_code.is_refusal());
        let policy = status(
            422,
            "Invalid",
            "ciliumidentities.cilium.io \"300\" is forbidden: ValidatingAdmissionPolicy 'ids' with binding 'ids' denied request: failed expression",
        );
        assert!(policy.is_denial());
        for other in [
            status(409, "AlreadyExists", "exists"),
            status(
                500,
                "InternalError",
                "admission webhook \"x\" failed to call",
            ),
            RequestError::Timeout,
        ] {
            assert!(!other.is_refusal(), "{other}");
        }
        assert!(!status(500, "", "admission webhook \"x\" denied the request").is_denial());
    }
}

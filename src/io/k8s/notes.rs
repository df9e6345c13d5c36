//! What the API server says beside its answers, seen on every request a client makes (a
//! layer in kube's own client stack): how often it pushed back (429 Too Many Requests, API
//! Priority and Fairness) and the `Warning` headers it sent, each distinct text kept once,
//! as kubectl shows them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use crate::core::server_said::ServerSaid;
use http::{HeaderMap, StatusCode};

/// Whether a new warning is printed on stderr as it comes (`Warning: TEXT`, as kubectl
/// prints it): set by a headless command; the TUI owns the terminal and shows it instead.
static ON_STDERR: AtomicBool = AtomicBool::new(false);

/// Prints each new warning of the API server on stderr from now on.
pub fn print_warnings_on_stderr() {
    ON_STDERR.store(true, Ordering::Relaxed);
}

/// What one client heard beside its answers.
#[derive(Debug, Default)]
pub struct ServerNotes {
    throttled: AtomicU64,
    /// Every distinct warning text, in the order first seen.
    warnings: Mutex<Vec<String>>,
    /// The number of distinct warnings, for those who show them as they come.
    seen: tokio::sync::watch::Sender<usize>,
}

/// Where a span starts: what had been heard by then.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mark {
    throttled: u64,
    warnings: usize,
}

impl ServerNotes {
    /// Takes in one answer's status and headers.
    pub fn observe(&self, status: StatusCode, headers: &HeaderMap) {
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        for value in headers.get_all("warning") {
            for text in warning_texts(&String::from_utf8_lossy(value.as_bytes())) {
                self.warned(text);
            }
        }
    }

    fn warned(&self, text: String) {
        let mut all = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        if all.contains(&text) {
            return;
        }
        tracing::info!(warning = %text, "the API server warns");
        if ON_STDERR.load(Ordering::Relaxed) {
            eprintln!("Warning: {text}");
        }
        all.push(text);
        let n = all.len();
        drop(all);
        self.seen.send_replace(n);
    }

    /// Answers that were 429, since the client was made.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Every distinct warning text heard so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes each time a new warning text is heard (its value: how many there are).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<usize> {
        self.seen.subscribe()
    }

    /// Now, as the start of a span.
    pub fn mark(&self) -> Mark {
        Mark {
            throttled: self.throttled(),
            warnings: self
                .warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len(),
        }
    }

    /// What was heard since `mark`.
    pub fn since(&self, mark: Mark) -> ServerSaid {
        let all = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        ServerSaid {
            throttled: self.throttled().saturating_sub(mark.throttled),
            warnings: all.iter().skip(mark.warnings).cloned().collect(),
        }
    }
}

/// The texts of one `Warning` header value (RFC 7234: `299 - "text"`, several separated by
/// commas; Kubernetes always sends code 299 and agent `-`). A value that is not in that form
/// is shown whole rather than dropped.
pub fn warning_texts(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = value.trim();
    while !rest.is_empty() {
        let Some(text) = one_warning(&mut rest) else {
            out.push(rest.to_string());
            break;
        };
        if !text.is_empty() {
            out.push(text);
        }
        rest = rest.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// Reads `code agent "text" ["date"]` off the front of `rest`.
fn one_warning(rest: &mut &str) -> Option<String> {
    let s = *rest;
    let (_code, s) = s.split_once(' ')?;
    let (_agent, s) = s.trim_start().split_once(' ')?;
    let s = s.trim_start().strip_prefix('"')?;
    let mut text = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => text.extend(chars.next().map(|(_, c)| c)),
            '"' => {
                let mut after = s[i + 1..].trim_start();
                // An optional quoted date follows the text.
                if let Some(date) = after.strip_prefix('"') {
                    after = date.split_once('"').map_or("", |(_, a)| a);
                }
                *rest = after;
                return Some(text);
            }
            c => text.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubernetes_warning_is_its_text() {
        assert_eq!(
            warning_texts(r#"299 - "cilium.io/v1 CiliumIdentity is deprecated; use cilium.io/v2""#),
            vec!["cilium.io/v1 CiliumIdentity is deprecated; use cilium.io/v2".to_string()]
        );
    }

    #[test]
    fn several_warnings_in_one_value_escapes_and_dates_are_read() {
        assert_eq!(
            warning_texts(
                r#"299 - "unknown field \"spec.x\"", 299 - "second" "Sat, 25 Aug 2012 23:34:45 GMT", 299 - "third""#
            ),
            vec![
                r#"unknown field "spec.x""#.to_string(),
                "second".into(),
                "third".into()
            ]
        );
    }

    #[test]
    fn a_value_not_in_the_form_is_shown_whole() {
        assert_eq!(
            warning_texts("something odd"),
            vec!["something odd".to_string()]
        );
        assert_eq!(warning_texts(""), Vec::<String>::new());
    }

    #[test]
    fn each_text_is_kept_once_and_429s_are_counted() {
        let notes = ServerNotes::default();
        let start = notes.mark();
        let mut h = HeaderMap::new();
        h.append("warning", r#"299 - "a""#.parse().unwrap());
        h.append("warning", r#"299 - "b""#.parse().unwrap());
        notes.observe(StatusCode::OK, &h);
        let middle = notes.mark();
        notes.observe(StatusCode::TOO_MANY_REQUESTS, &h);
        notes.observe(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new());
        assert_eq!(notes.warnings(), vec!["a".to_string(), "b".into()]);
        assert_eq!(
            notes.since(start),
            ServerSaid {
                throttled: 2,
                warnings: vec!["a".into(), "b".into()]
            }
        );
        assert_eq!(
            notes.since(middle),
            ServerSaid {
                throttled: 2,
                warnings: vec![]
            }
        );
        assert_eq!(*notes.subscribe().borrow(), 2);
    }
}

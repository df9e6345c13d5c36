//! HTTP helpers of the sandbox API server: response bodies, `metav1.Status` failures and
//! query strings. A leaf: it knows nothing of the store or the routes.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use serde_json::{Value, json};

pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(status: StatusCode, body: Vec<u8>, content_type: &str) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from(body)).boxed());
    *res.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        res.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    res
}

pub fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    full(status, v.to_string().into_bytes(), "application/json")
}

/// A `metav1.Status` failure body, as the API server sends it.
pub fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Response<Body> {
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        body["details"] = d;
    }
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &body,
    )
}

/// What an unknown path gets: plain text, not a Status (as for a CRD that is not established).
pub fn page_not_found() -> Response<Body> {
    full(
        StatusCode::NOT_FOUND,
        b"404 page not found\n".to_vec(),
        "text/plain; charset=utf-8",
    )
}

pub fn query_params(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_decode() {
        assert_eq!(percent_decode("app%3Dweb%2Ctier+in"), "app=web,tier in");
        assert_eq!(percent_decode("100%"), "100%");
    }
}

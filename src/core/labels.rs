//! Cilium label keys: parsing the kvstore form, re-encoding it canonically, and the maps
//! a `CiliumIdentity` carries (`security-labels` and the sanitized `metadata.labels`).

use std::collections::BTreeMap;
use std::fmt;

/// `security-labels`: `source:key` -> value, exactly what Cilium's `GetAsMap()` gives.
pub type SecurityLabels = BTreeMap<String, String>;

/// One label as Cilium stores it in a label key: `source:key=value;`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub source: String,
    pub key: String,
    pub value: String,
}

/// Why a kvstore value is not a label key that Cilium's writer could have produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelKeyError {
    Empty,
    /// The whole label key is larger than any Cilium writes.
    TooLarge {
        bytes: usize,
    },
    /// One `source:key=value` item is larger than any Cilium writes; `key` is its start.
    LabelTooLarge {
        key: String,
        bytes: usize,
    },
    NotUtf8,
    MissingTrailingSemicolon,
    EmptyItem {
        index: usize,
    },
    MissingSource {
        item: String,
    },
    MissingEquals {
        item: String,
    },
    EmptyKey {
        item: String,
    },
    DuplicateKey {
        key: String,
    },
    NotCanonicalOrder {
        before: String,
        after: String,
    },
}

impl fmt::Display for LabelKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelKeyError::Empty => write!(f, "empty label key (no labels)"),
            LabelKeyError::TooLarge { bytes } => write!(
                f,
                "label key is {bytes} bytes, over the {MAX_LABEL_KEY_BYTES}-byte bound: no Cilium writes one this large"
            ),
            LabelKeyError::LabelTooLarge { key, bytes } => write!(
                f,
                "label {key:?}... is {bytes} bytes, over the {MAX_LABEL_BYTES}-byte bound for one label: no Cilium writes one this large"
            ),
            LabelKeyError::NotUtf8 => write!(f, "label key is not valid UTF-8"),
            LabelKeyError::MissingTrailingSemicolon => {
                write!(f, "label key does not end with ';' as Cilium writes it")
            }
            LabelKeyError::EmptyItem { index } => write!(f, "label #{index} is empty (';;')"),
            LabelKeyError::MissingSource { item } => {
                write!(f, "label {item:?} has no 'source:' prefix")
            }
            LabelKeyError::MissingEquals { item } => write!(f, "label {item:?} has no '='"),
            LabelKeyError::EmptyKey { item } => write!(f, "label {item:?} has an empty key"),
            LabelKeyError::DuplicateKey { key } => write!(f, "label key {key:?} appears twice"),
            LabelKeyError::NotCanonicalOrder { before, after } => write!(
                f,
                "labels are not in Cilium's sorted order ({before:?} before {after:?}); no agent looks this key up"
            ),
        }
    }
}

impl Label {
    /// `source:key`, the form used as a `security-labels` map key.
    pub fn map_key(&self) -> String {
        format!("{}:{}", self.source, self.key)
    }
}

/// Largest label key accepted (all labels together). Kubernetes label values stop at 63
/// characters and keys at 317 (a 253-character prefix and a 63-character name); other sources
/// hold DNS names, CIDRs or container labels. 64 KiB is far past any real label set.
pub const MAX_LABEL_KEY_BYTES: usize = 64 * 1024;
/// Largest single `source:key=value` label accepted.
pub const MAX_LABEL_BYTES: usize = 4 * 1024;

/// Parses a kvstore label key strictly: it must be exactly what Cilium's writer produces,
/// so that `encode_label_key(&parse_label_key(s)?) == s` byte for byte, and no larger than
/// `MAX_LABEL_KEY_BYTES` in all or `MAX_LABEL_BYTES` for one label.
pub fn parse_label_key(raw: &str) -> Result<Vec<Label>, LabelKeyError> {
    let mut labels: Vec<Label> = Vec::new();
    scan_label_key(raw, |source, key, value| {
        labels.push(Label {
            source: source.to_string(),
            key: key.to_string(),
            value: value.to_string(),
        })
    })?;
    Ok(labels)
}

/// The key of an item already scanned (valid): `source:key=value`.
fn item_key(item: &str) -> Option<&str> {
    match scan_item(item.as_bytes(), 0) {
        (_, Some(colon), Some(equals)) => Some(&item[colon + 1..equals]),
        _ => None,
    }
}

/// `parse_label_key`'s checks, each label handed to `each` (source, key, value) as it is
/// read, without a copy: checking a label key allocates nothing (the planner checks every
/// identity's at every full plan).
fn scan_label_key<'a>(
    raw: &'a str,
    mut each: impl FnMut(&'a str, &'a str, &'a str),
) -> Result<(), LabelKeyError> {
    if raw.is_empty() {
        return Err(LabelKeyError::Empty);
    }
    if raw.len() > MAX_LABEL_KEY_BYTES {
        return Err(LabelKeyError::TooLarge { bytes: raw.len() });
    }
    let body = raw
        .strip_suffix(';')
        .ok_or(LabelKeyError::MissingTrailingSemicolon)?;
    let mut prev: Option<&str> = None;
    let mut start = 0;
    for index in 0.. {
        let (end, colon, equals) = scan_item(body.as_bytes(), start);
        let item = &body[start..end];
        if item.is_empty() {
            return Err(LabelKeyError::EmptyItem { index });
        }
        if item.len() > MAX_LABEL_BYTES {
            let start: String = item.chars().take(40).collect();
            return Err(LabelKeyError::LabelTooLarge {
                key: start,
                bytes: item.len(),
            });
        }
        // `:` and `=` are ASCII, so a byte found is a character boundary.
        let source = match colon {
            Some(c) if c > start => &body[start..c],
            _ => {
                return Err(LabelKeyError::MissingSource {
                    item: item.to_string(),
                });
            }
        };
        let (key, value) = match (colon, equals) {
            (Some(c), Some(e)) => (&body[c + 1..e], &body[e + 1..end]),
            _ => {
                return Err(LabelKeyError::MissingEquals {
                    item: item.to_string(),
                });
            }
        };
        if key.is_empty() {
            return Err(LabelKeyError::EmptyKey {
                item: item.to_string(),
            });
        }
        if let Some(prev) = prev {
            // Cilium sorts by the key without its source; equal keys cannot both be in a label set.
            match prev.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    return Err(LabelKeyError::DuplicateKey {
                        key: key.to_string(),
                    });
                }
                std::cmp::Ordering::Greater => {
                    let mut earlier = body.split(';').take(index).filter_map(item_key);
                    if earlier.any(|k| k == key) {
                        return Err(LabelKeyError::DuplicateKey {
                            key: key.to_string(),
                        });
                    }
                    return Err(LabelKeyError::NotCanonicalOrder {
                        before: prev.to_string(),
                        after: key.to_string(),
                    });
                }
            }
        }
        each(source, key, value);
        prev = Some(key);
        if end == body.len() {
            break;
        }
        start = end + 1;
    }
    Ok(())
}

/// One item of a label key's body, read from `start` in one pass (a key is checked at every
/// plan and at every change sync follows): where it ends (its `;`, or the body's end), its
/// first `:`, and the first `=` after that `:`.
fn scan_item(body: &[u8], start: usize) -> (usize, Option<usize>, Option<usize>) {
    let (mut colon, mut equals) = (None, None);
    for (at, b) in body[start..].iter().enumerate() {
        let at = start + at;
        match b {
            b';' => return (at, colon, equals),
            b':' if colon.is_none() => colon = Some(at),
            b'=' if colon.is_some() && equals.is_none() => equals = Some(at),
            _ => {}
        }
    }
    (body.len(), colon, equals)
}

/// Parses raw kvstore bytes (which need not be UTF-8) into labels.
pub fn parse_label_key_bytes(raw: &[u8]) -> Result<Vec<Label>, LabelKeyError> {
    let s = std::str::from_utf8(raw).map_err(|_| LabelKeyError::NotUtf8)?;
    parse_label_key(s)
}

/// Checks raw kvstore bytes and returns them as text when they are a valid label key. Such a
/// key is canonical, so it can be compared as text with `canonical_key` of another label set.
pub fn valid_label_key(raw: &[u8]) -> Result<&str, LabelKeyError> {
    let s = std::str::from_utf8(raw).map_err(|_| LabelKeyError::NotUtf8)?;
    scan_label_key(s, |_, _, _| {}).map(|()| s)
}

/// Encodes labels the way Cilium's `GetKey` does: sorted by key, `source:key=value;` each.
pub fn encode_label_key(labels: &[Label]) -> String {
    encode_sorted(
        labels
            .iter()
            .map(|l| (l.source.as_str(), l.key.as_str(), l.value.as_str()))
            .collect(),
    )
}

/// The one encoding of a label key, over borrowed (source, key, value) triples: sorted by
/// key, stably (labels of one key keep their sources' order), `source:key=value;` each.
fn encode_sorted(mut labels: Vec<(&str, &str, &str)>) -> String {
    labels.sort_by(|a, b| a.1.cmp(b.1));
    let mut out = String::with_capacity(
        labels
            .iter()
            .map(|l| l.0.len() + l.1.len() + l.2.len() + 3)
            .sum(),
    );
    for (source, key, value) in labels {
        out.push_str(source);
        out.push(':');
        out.push_str(key);
        out.push('=');
        out.push_str(value);
        out.push(';');
    }
    out
}

/// `security-labels` of a label set.
pub fn to_security_labels(labels: &[Label]) -> SecurityLabels {
    labels
        .iter()
        .map(|l| (l.map_key(), l.value.clone()))
        .collect()
}

/// Rebuilds the canonical kvstore label key from a `security-labels` map, if every map key
/// has a source. Used to show Kubernetes-side labels in the same form as kvstore ones.
pub fn label_key_from_map(map: &SecurityLabels) -> Option<String> {
    label_key_from_pairs(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// The canonical label key of `security-labels` entries (`source:key`, value), if every key
/// has a source; borrowed, so a listed object's labels are encoded without a copy of each.
pub fn label_key_from_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let mut labels = Vec::with_capacity(pairs.size_hint().0);
    for (k, v) in pairs {
        let (source, key) = k.split_once(':')?;
        labels.push((source, key, v));
    }
    Some(encode_sorted(labels))
}

/// A label set in Cilium's canonical kvstore form (`source:key=value;...`, sorted by key).
/// Label sets are compared in this form: one string instead of a map of strings, which keeps
/// 65,280 identities per side cheap to hold and to compare.
pub type LabelKey = String;

/// The canonical label key of a `security-labels` map. A map whose keys lack a source (which
/// no kvstore identity can have) yields its JSON form, which never equals a kvstore label key.
pub fn canonical_key(map: &SecurityLabels) -> LabelKey {
    label_key_from_map(map).unwrap_or_else(|| serde_json::to_string(map).unwrap_or_default())
}

/// The `metadata.labels` Cilium derives for humans and selectors, as its CRD backend writes
/// them (1.18's `pkg/k8s/identitybackend`): `k8s:` labels with the prefix stripped, except the
/// namespace's own labels (`io.cilium.k8s.namespace.labels.*`), keeping only keys and values
/// the API server accepts, so an odd label value can never make the whole create fail with
/// 422 (Cilium's own create fails there). What is left out for that is `left_out_of_metadata`.
pub fn metadata_labels(security: &SecurityLabels) -> BTreeMap<String, String> {
    metadata_candidates(security)
        .filter(|(key, v)| is_valid_label_key(key) && is_valid_label_value(v))
        .map(|(key, v)| (key.to_string(), v.to_string()))
        .collect()
}

/// The keys Cilium would put in `metadata.labels` that the API server would refuse (an
/// invalid key or value): left out of it, kept exactly in `security-labels`.
pub fn left_out_of_metadata(security: &SecurityLabels) -> Vec<String> {
    metadata_candidates(security)
        .filter(|(key, v)| !(is_valid_label_key(key) && is_valid_label_value(v)))
        .map(|(key, _)| key.to_string())
        .collect()
}

/// Prefix of the namespace labels Cilium copies into an identity; never in `metadata.labels`.
const NAMESPACE_LABELS: &str = "io.cilium.k8s.namespace.labels.";

fn metadata_candidates(security: &SecurityLabels) -> impl Iterator<Item = (&str, &str)> {
    security.iter().filter_map(|(k, v)| {
        let key = k.strip_prefix("k8s:")?;
        (!key.starts_with(NAMESPACE_LABELS)).then_some((key, v.as_str()))
    })
}

/// A Kubernetes qualified name: `[prefix/]name`, name up to 63 chars of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric; prefix a DNS-1123 subdomain up to 253 chars.
pub fn is_valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns1123_subdomain(p)
    {
        return false;
    }
    !name.is_empty() && is_label_value_shape(name)
}

/// A Kubernetes label value: empty, or up to 63 chars of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || is_label_value_shape(value)
}

fn is_label_value_shape(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 63
        && b.first().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.last().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// RFC 1123 subdomain as Kubernetes checks it (object names, label key prefixes).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.first()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.last()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_label_splits_at_its_first_colon_then_the_first_equals_after_it() {
        let read = |raw: &str| {
            parse_label_key(raw).map(|ls| {
                ls.into_iter()
                    .map(|l| format!("{}|{}|{}", l.source, l.key, l.value))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(read("k8s:a=b=c;"), Ok(vec!["k8s|a|b=c".into()]));
        assert_eq!(read("k8s:a:b=c;"), Ok(vec!["k8s|a:b|c".into()]));
        assert_eq!(read("k=8s:a=;"), Ok(vec!["k=8s|a|".into()]));
        assert_eq!(
            read("k8s:a=1;reserved:b=é:2;"),
            Ok(vec!["k8s|a|1".into(), "reserved|b|é:2".into()])
        );
        assert_eq!(
            read(":a=1;"),
            Err(LabelKeyError::MissingSource {
                item: ":a=1".into()
            })
        );
        assert_eq!(
            read("k8s=a:1;"),
            Err(LabelKeyError::MissingEquals {
                item: "k8s=a:1".into()
            })
        );
        assert_eq!(
            read("k8s:=1;"),
            Err(LabelKeyError::EmptyKey {
                item: "k8s:=1".into()
            })
        );
        assert_eq!(
            read("k8s:a=1;;"),
            Err(LabelKeyError::EmptyItem { index: 1 })
        );
        assert_eq!(read(";"), Err(LabelKeyError::EmptyItem { index: 0 }));
    }

    #[test]
    fn the_size_bound_is_inclusive() {
        // At the bound the key is read (and refused for its shape); one byte more is too large.
        let at = "x".repeat(MAX_LABEL_KEY_BYTES);
        assert!(!matches!(
            parse_label_key(&at),
            Err(LabelKeyError::TooLarge { .. })
        ));
        let over = "x".repeat(MAX_LABEL_KEY_BYTES + 1);
        assert!(matches!(
            parse_label_key(&over),
            Err(LabelKeyError::TooLarge { .. })
        ));
    }

    #[test]
    fn rfc_1123_subdomains_as_kubernetes_checks_them() {
        for good in ["a", "abc", "a-1", "300", "a.b-c.d9"] {
            assert!(is_dns1123_subdomain(good), "{good}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", ".a"] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn canonical_key_round_trips() {
        let raw = "k8s:app=web;reserved:host=;k8s:io.kubernetes.pod.namespace=shop;";
        let labels = parse_label_key(raw).unwrap();
        assert_eq!(labels.len(), 3);
        assert_eq!(labels[1].value, "");
        assert_eq!(encode_label_key(&labels), raw);
        let map = to_security_labels(&labels);
        assert_eq!(map["reserved:host"], "");
        assert_eq!(label_key_from_map(&map).unwrap(), raw);
    }

    #[test]
    fn implausibly_large_keys_and_labels_are_refused_by_size() {
        // At the bounds: accepted.
        let at_label = format!("k8s:a={};", "v".repeat(MAX_LABEL_BYTES - 6));
        assert_eq!(at_label.len() - 1, MAX_LABEL_BYTES);
        assert!(parse_label_key(&at_label).is_ok());
        // One byte over for one label.
        let over_label = format!("k8s:a={};", "v".repeat(MAX_LABEL_BYTES - 5));
        let e = parse_label_key(&over_label).unwrap_err();
        assert_eq!(
            e,
            LabelKeyError::LabelTooLarge {
                key: format!("k8s:a={}", "v".repeat(34)),
                bytes: MAX_LABEL_BYTES + 1
            }
        );
        assert!(e.to_string().contains("4097 bytes"), "{e}");
        // Many small labels over the total bound (a 400 KiB key, as seen on a real cluster).
        let many: String = (0..20_000).map(|n| format!("k8s:l{n:05}=x;")).collect();
        assert!(many.len() > MAX_LABEL_KEY_BYTES);
        let e = parse_label_key(&many).unwrap_err();
        assert_eq!(e, LabelKeyError::TooLarge { bytes: many.len() });
        assert!(
            e.to_string().contains(&format!("{} bytes", many.len())),
            "{e}"
        );
        let mut at_total = String::new();
        let mut n = 0;
        while at_total.len() + 12 <= MAX_LABEL_KEY_BYTES {
            at_total.push_str(&format!("k8s:l{n:05}=x;"));
            n += 1;
        }
        assert!(parse_label_key(&at_total).is_ok());
    }

    #[test]
    fn values_may_hold_equals_and_keys_colons() {
        let raw = "cidr:2001:db8::/64=;k8s:x=a=b;";
        let labels = parse_label_key(raw).unwrap();
        assert_eq!(labels[0].key, "2001:db8::/64");
        assert_eq!(labels[1].value, "a=b");
        assert_eq!(encode_label_key(&labels), raw);
    }

    #[test]
    fn rejects_what_cilium_could_not_write() {
        assert_eq!(parse_label_key(""), Err(LabelKeyError::Empty));
        assert_eq!(
            parse_label_key("k8s:a=b"),
            Err(LabelKeyError::MissingTrailingSemicolon)
        );
        assert!(matches!(
            parse_label_key("k8s:a=b;;"),
            Err(LabelKeyError::EmptyItem { .. })
        ));
        assert!(matches!(
            parse_label_key("a=b;"),
            Err(LabelKeyError::MissingSource { .. })
        ));
        assert!(matches!(
            parse_label_key(":a=b;"),
            Err(LabelKeyError::MissingSource { .. })
        ));
        assert!(matches!(
            parse_label_key("k8s:a;"),
            Err(LabelKeyError::MissingEquals { .. })
        ));
        assert!(matches!(
            parse_label_key("k8s:=b;"),
            Err(LabelKeyError::EmptyKey { .. })
        ));
        assert!(matches!(
            parse_label_key("k8s:a=1;k8s:a=2;"),
            Err(LabelKeyError::DuplicateKey { .. })
        ));
        assert!(matches!(
            parse_label_key("k8s:a=1;container:a=2;"),
            Err(LabelKeyError::DuplicateKey { .. })
        ));
        assert!(matches!(
            parse_label_key("k8s:b=1;k8s:a=2;"),
            Err(LabelKeyError::NotCanonicalOrder { .. })
        ));
        assert!(matches!(
            parse_label_key("k8s:a=1;k8s:c=1;k8s:a=2;"),
            Err(LabelKeyError::DuplicateKey { .. })
        ));
        assert_eq!(
            parse_label_key_bytes(b"k8s:a=\xff;"),
            Err(LabelKeyError::NotUtf8)
        );
    }

    #[test]
    fn metadata_labels_keep_only_valid_k8s_labels() {
        let mut m = SecurityLabels::new();
        m.insert("k8s:app".into(), "web".into());
        m.insert("k8s:io.kubernetes.pod.namespace".into(), "shop".into());
        m.insert("k8s:weird".into(), "has space".into());
        m.insert("k8s:bad key".into(), "v".into());
        m.insert("reserved:host".into(), "".into());
        m.insert("container:x".into(), "y".into());
        let md = metadata_labels(&m);
        assert_eq!(md.len(), 2);
        assert_eq!(md["app"], "web");
        assert_eq!(md["io.kubernetes.pod.namespace"], "shop");
    }

    #[test]
    fn label_key_and_value_validation() {
        assert!(is_valid_label_key("app.kubernetes.io/name"));
        assert!(!is_valid_label_key("Bad.Prefix/name"));
        assert!(!is_valid_label_key("a/b/c"));
        assert!(!is_valid_label_key(""));
        assert!(is_valid_label_value(""));
        assert!(!is_valid_label_value("-x"));
        assert!(!is_valid_label_value(&"a".repeat(64)));
        assert!(is_valid_label_value(&"a".repeat(63)));
    }
}

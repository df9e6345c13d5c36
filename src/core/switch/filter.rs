//! Cilium's identity label filter (`pkg/labelsfilter`) as Cilium 1.18's operator runs it:
//! which of a pod's labels go into the security identity it computes.
//!
//! The rules, from the source and checked against the operator itself: a pattern is
//! `[source:]prefix`, `!` in front of the prefix makes it an ignore, the prefix is a regular
//! expression that must match at the start of the label's key. A label is kept when no
//! include pattern is configured and no ignore matches, or when the longest matching include
//! is longer than the shortest matching ignore. Any include pattern of the operator's own
//! (`--labels`) turns the filter into an allow list.

use regex::Regex;

/// One pattern of the filter.
#[derive(Debug, Clone)]
pub struct LabelPrefix {
    /// The pattern as written.
    pub written: String,
    ignore: bool,
    /// Empty: any source.
    source: String,
    expr: Regex,
}

/// A pattern the filter cannot use, with what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label pattern {pattern:?}: {why}")]
pub struct BadPattern {
    pub pattern: String,
    pub why: String,
}

impl LabelPrefix {
    /// Parses a pattern as Cilium's `parseLabelPrefix` does: the source is what comes before
    /// the first `:`, so `!k8s:foo` names the source `!k8s` (it matches nothing) where
    /// `k8s:!foo` is the ignore that was meant.
    pub fn parse(written: &str) -> Result<LabelPrefix, BadPattern> {
        let bad = |why: String| BadPattern {
            pattern: written.to_string(),
            why,
        };
        let (source, mut prefix) = match written.find(':') {
            Some(i) => (&written[..i], &written[i + 1..]),
            None => ("", written),
        };
        if prefix.is_empty() {
            return Err(bad("the prefix after the source is empty".into()));
        }
        let ignore = prefix.starts_with('!');
        if ignore {
            prefix = &prefix[1..];
        }
        let expr = Regex::new(prefix)
            .map_err(|e| bad(format!("not a regular expression Cilium can compile: {e}")))?;
        Ok(LabelPrefix {
            written: written.to_string(),
            ignore,
            source: source.to_string(),
            expr,
        })
    }

    /// Whether it matches a label, and over how many bytes of its key.
    fn matches(&self, source: &str, key: &str) -> Option<usize> {
        if !self.source.is_empty() && self.source != source {
            return None;
        }
        // Go's FindStringIndex and Rust's find both give the leftmost-first match; Cilium
        // counts it only when it starts the key.
        self.expr
            .find(key)
            .filter(|m| m.start() == 0)
            .map(|m| m.end())
    }

    /// A pattern whose source can never be a label's: written `!k8s:x` for `k8s:!x`.
    pub fn matches_nothing(&self) -> bool {
        self.source.starts_with('!')
    }
}

/// Cilium 1.18's default patterns, in its order (the operator logs them at start).
pub const CILIUM_1_18_DEFAULTS: &[&str] = &[
    "reserved:.*",
    r"io\.kubernetes\.pod\.namespace",
    r"io\.cilium\.k8s\.namespace\.labels",
    r"app\.kubernetes\.io",
    r"io\.cilium\.k8s\.policy\.cluster",
    r"!io\.kubernetes",
    r"!kubernetes\.io",
    r"!statefulset\.kubernetes\.io/pod-name",
    r"!apps\.kubernetes\.io/pod-index",
    r"!batch\.kubernetes\.io/job-completion-index",
    r"!batch\.kubernetes\.io/controller-uid",
    r"!.*beta\.kubernetes\.io",
    r"!k8s\.io",
    r"!pod-template-generation",
    r"!pod-template-hash",
    r"!controller-revision-hash",
    r"!controller-uid",
    r"!annotation.*",
    r"!etcd_node",
];

/// The filter: its patterns and whether it is an allow list.
#[derive(Debug, Clone)]
pub struct LabelFilter {
    prefixes: Vec<LabelPrefix>,
    allow_list: bool,
}

impl LabelFilter {
    /// Cilium 1.18's defaults followed by the operator's own patterns (`labels` in
    /// `cilium-config`), as `ParseLabelPrefixCfg` builds it without a label prefix file.
    pub fn cilium_1_18(own: &[String]) -> Result<LabelFilter, BadPattern> {
        let mut prefixes = Vec::with_capacity(CILIUM_1_18_DEFAULTS.len() + own.len());
        for p in CILIUM_1_18_DEFAULTS {
            prefixes.push(LabelPrefix::parse(p)?);
        }
        let mut allow_list = false;
        for p in own.iter().filter(|p| !p.is_empty()) {
            let parsed = LabelPrefix::parse(p)?;
            // Only the operator's own includes make an allow list; the defaults' do not.
            allow_list |= !parsed.ignore;
            prefixes.push(parsed);
        }
        Ok(LabelFilter {
            prefixes,
            allow_list,
        })
    }

    /// Whether a label of this source and key goes into the identity.
    pub fn keeps(&self, source: &str, key: &str) -> bool {
        let mut included = 0;
        let mut ignored = 0;
        for p in &self.prefixes {
            if let Some(len) = p.matches(source, key) {
                if p.ignore {
                    if ignored == 0 || len < ignored {
                        ignored = len;
                    }
                } else if len > included {
                    included = len;
                }
            }
        }
        (!self.allow_list && ignored == 0) || included > ignored
    }

    /// The operator's own patterns that can match no label, for the report to name.
    pub fn patterns_matching_nothing(&self) -> Vec<String> {
        self.prefixes
            .iter()
            .filter(|p| p.matches_nothing())
            .map(|p| p.written.clone())
            .collect()
    }

    /// Whether the operator's own patterns made it an allow list.
    pub fn is_allow_list(&self) -> bool {
        self.allow_list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(own: &[&str]) -> LabelFilter {
        let own: Vec<String> = own.iter().map(|s| s.to_string()).collect();
        LabelFilter::cilium_1_18(&own).expect("patterns")
    }

    #[test]
    fn the_defaults_keep_application_labels_and_drop_kubernetes_bookkeeping() {
        let f = filter(&[]);
        for kept in [
            "app",
            "tier",
            "io.kubernetes.pod.namespace",
            "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name",
            "io.cilium.k8s.namespace.labels.team",
            "io.cilium.k8s.policy.cluster",
            "io.cilium.k8s.policy.serviceaccount",
            "app.kubernetes.io/name",
        ] {
            assert!(f.keeps("k8s", kept), "{kept} should be kept");
        }
        for dropped in [
            "pod-template-hash",
            "controller-revision-hash",
            "controller-uid",
            "batch.kubernetes.io/controller-uid",
            "statefulset.kubernetes.io/pod-name",
            "io.kubernetes.container.name",
            "kubernetes.io/hostname",
            "beta.kubernetes.io/arch",
            "node.beta.kubernetes.io/instance-type",
            "k8s.io/foo",
            "annotation.x",
            "etcd_node",
        ] {
            assert!(!f.keeps("k8s", dropped), "{dropped} should be dropped");
        }
    }

    #[test]
    fn a_longer_include_wins_over_a_shorter_ignore() {
        // Cilium's own example: {!foo, foo.bar} keeps foo.bar.
        let f = filter(&["k8s:!foo", r"k8s:foo\.bar"]);
        assert!(f.keeps("k8s", "foo.bar"));
        assert!(!f.keeps("k8s", "foo.baz"));
        // A namespace label under the default include is longer than kubernetes.io's ignore.
        assert!(f.keeps("k8s", "io.cilium.k8s.namespace.labels.kubernetes.io/x"));
    }

    #[test]
    fn an_own_include_makes_an_allow_list_that_drops_the_service_account() {
        let f = filter(&["k8s:app"]);
        assert!(f.is_allow_list());
        assert!(f.keeps("k8s", "app"));
        assert!(f.keeps("k8s", "application"), "a prefix, not a whole key");
        assert!(!f.keeps("k8s", "tier"));
        assert!(!f.keeps("k8s", "io.cilium.k8s.policy.serviceaccount"));
        assert!(f.keeps("k8s", "io.cilium.k8s.policy.cluster"));
        assert!(f.keeps("k8s", "io.kubernetes.pod.namespace"));
    }

    #[test]
    fn a_source_must_match_and_the_match_must_start_the_key() {
        let f = filter(&["container:app"]);
        assert!(!f.keeps("k8s", "app"));
        assert!(f.keeps("container", "app"));
        let f = filter(&["k8s:app"]);
        assert!(!f.keeps("k8s", "myapp"));
    }

    #[test]
    fn a_bang_before_the_source_is_a_pattern_that_matches_nothing() {
        let f = filter(&["!k8s:tier"]);
        assert_eq!(f.patterns_matching_nothing(), vec!["!k8s:tier".to_string()]);
        // Cilium counts it as an include: an allow list that keeps no `tier` ... and no app.
        assert!(f.is_allow_list());
        assert!(!f.keeps("k8s", "app"));
        let f = filter(&["k8s:!tier"]);
        assert!(f.patterns_matching_nothing().is_empty());
        assert!(!f.keeps("k8s", "tier"));
        assert!(f.keeps("k8s", "app"));
    }

    #[test]
    fn a_pattern_that_is_not_a_regular_expression_is_named() {
        let err = LabelFilter::cilium_1_18(&["k8s:(".to_string()]).unwrap_err();
        assert_eq!(err.pattern, "k8s:(");
        let err = LabelFilter::cilium_1_18(&["k8s:".to_string()]).unwrap_err();
        assert!(err.why.contains("empty"), "{err}");
    }
}

//! `audit`: both identity stores read (the kvstore at one pinned revision with every
//! `value/` key, then every `CiliumIdentity` with the GC's mark, then the CiliumEndpoints)
//! and audited by labels (`core::audit`). Nothing is written. Where a part cannot be read
//! because it is not served (no CiliumEndpoint CRD, a snapshot without `value/` keys), the
//! audit goes on without it and says what was not checked.

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::core::audit::{AuditInput, AuditReport, FindingKind, audit};
use crate::core::range::IdRange;
use crate::error::{Error, Result};
use crate::io::k8s::K8sTarget;
use crate::io::kv_source::KvSource;

/// An audit and where it was read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditRun {
    #[serde(flatten)]
    pub report: AuditReport,
    pub kvstore_revision: i64,
    /// What could not be checked, and why.
    pub not_checked: Vec<String>,
}

/// Reads both stores and audits them.
pub async fn run(kv: &KvSource, target: &K8sTarget, range: IdRange) -> Result<AuditRun> {
    let mut not_checked = Vec::new();
    let snap = kv.read_masters().await?;
    let values = match kv.read_value_keys(&snap).await? {
        Some(v) => v,
        None => {
            not_checked.push(
                "stale value/ keys and the nodes behind findings: this kvstore source keeps no value/ keys"
                    .to_string(),
            );
            Vec::new()
        }
    };
    let objects = match target.identities_with_marks().await {
        Ok(o) => o,
        Err(e) if e.is_404() => {
            not_checked.push(
                "nothing in Kubernetes: ciliumidentities.cilium.io is not served (no CRD yet)"
                    .to_string(),
            );
            Vec::new()
        }
        Err(e) => {
            return Err(Error::kube(
                target.server.clone(),
                "listing CiliumIdentities",
                e,
            ));
        }
    };
    let endpoints = match crate::io::endpoints::identities_in_use(target).await {
        Ok(e) => Some(e),
        Err(e) if e.is_404() => {
            not_checked.push(
                "endpoints behind findings: ciliumendpoints.cilium.io is not served".to_string(),
            );
            None
        }
        Err(e) => {
            return Err(Error::kube(
                target.server.clone(),
                "listing CiliumEndpoints",
                e,
            ));
        }
    };
    let report = audit(&AuditInput {
        masters: &snap.masters,
        values: &values,
        objects: &objects,
        endpoints: endpoints.as_ref(),
        range,
    });
    Ok(AuditRun {
        report,
        kvstore_revision: snap.source.revision,
        not_checked,
    })
}

/// Findings of one kind printed in full; the rest are counted (JSON lists every one).
const AUDIT_SHOWN_PER_KIND: usize = 20;

/// The audit as text: where it was read, the counts, each finding with its nodes, endpoints
/// and what to do, and what could not be checked.
/// What the decision logs at `paths` decided, as the audit reads it: each kvstore id that
/// was remapped, reused, skipped or created as a duplicate at its own id, with the id it is
/// served at and the labels decided for.
pub fn decisions_from_logs(
    paths: &[std::path::PathBuf],
) -> Result<std::collections::BTreeMap<u32, (Option<u32>, String)>> {
    let e = crate::app::flows::expectations_from_logs(paths)?;
    let moved = e
        .mappings
        .iter()
        .filter_map(|(id, to)| {
            let labels = e.mapped_labels.get(id)?;
            Some((id.parse().ok()?, (*to, labels.clone())))
        })
        .filter(|(id, (to, _))| *to != Some(*id));
    // A duplicate created at its own id by decision: served where it is, on purpose.
    let duplicates = e.duplicates_decided.iter().filter_map(|(id, labels)| {
        let n: u32 = id.parse().ok()?;
        Some((n, (Some(n), labels.clone())))
    });
    Ok(moved.chain(duplicates).collect())
}

pub fn summary(run: &AuditRun) -> String {
    use crate::core::audit::FindingKind;
    let r = &run.report;
    let mut out = format!(
        "audit of both identity stores: {} kvstore identities (revision {}; {} invalid entries not audited), {} CiliumIdentity objects\n",
        r.kvstore_identities, run.kvstore_revision, r.invalid_ignored, r.objects
    );
    out.push_str(&format!("findings: {}\n", counts_text(r)));
    for kind in FindingKind::ALL {
        let of_kind: Vec<_> = r.findings.iter().filter(|f| f.kind == kind).collect();
        for f in of_kind.iter().take(AUDIT_SHOWN_PER_KIND) {
            let side = f.side.map_or(String::new(), |s| match s {
                crate::core::audit::Side::Kvstore => " (kvstore)".into(),
                crate::core::audit::Side::Kubernetes => " (Kubernetes)".into(),
            });
            let other = match (f.other_id, &f.other_labels) {
                (Some(id), Some(l)) => format!(" · other: {id} {l}"),
                (Some(id), None) => format!(" · other id: {id}"),
                (None, Some(l)) => format!(" · other labels: {l}"),
                (None, None) => String::new(),
            };
            out.push_str(&format!(
                "{} {}{side}: {}{other}\n",
                kind.as_str(),
                f.id,
                f.labels
            ));
            if !f.nodes.is_empty() || !f.endpoints.is_empty() {
                out.push_str(&format!(
                    "  nodes: {} · endpoints: {}\n",
                    join_or_none(&f.nodes),
                    join_or_none(&f.endpoints)
                ));
            }
            out.push_str(&format!("  do: {}\n", f.action));
        }
        if of_kind.len() > AUDIT_SHOWN_PER_KIND {
            out.push_str(&format!(
                "{}: {} more (--output json lists every one)\n",
                kind.as_str(),
                of_kind.len() - AUDIT_SHOWN_PER_KIND
            ));
        }
    }
    if !r.decided.is_empty() {
        out.push_str(&format!(
            "explained by recorded decisions (not findings): {}\n",
            r.decided.len()
        ));
        for d in r.decided.iter().take(AUDIT_SHOWN_PER_KIND) {
            out.push_str(&format!(
                "{} {}: {} · {}\n",
                d.finding.kind.as_str(),
                d.finding.id,
                d.finding.labels,
                d.decision
            ));
        }
        if r.decided.len() > AUDIT_SHOWN_PER_KIND {
            out.push_str(&format!(
                "explained: {} more (--output json lists every one)\n",
                r.decided.len() - AUDIT_SHOWN_PER_KIND
            ));
        }
    }
    for n in &run.not_checked {
        out.push_str(&format!("not checked: {n}\n"));
    }
    if r.clean() {
        out.push_str("clean: the two stores agree by labels\n");
    }
    out
}

fn join_or_none(items: &[String]) -> String {
    crate::core::audit::names_list(items, 8)
}

/// What `audit --watch` exports: `cilium_idmig_audit_findings{kind}` after each audit, and
/// whether the last audit could read both stores (`/healthz`).
pub struct AuditMetrics {
    registry: Registry,
    findings: IntGaugeVec,
    ok: AtomicBool,
}

impl AuditMetrics {
    pub fn new() -> Result<Self> {
        let err = |e: prometheus::Error| Error::Config(format!("metrics: {e}"));
        let findings = IntGaugeVec::new(
            Opts::new(
                "cilium_idmig_audit_findings",
                "Findings of the last audit of both identity stores, by kind",
            ),
            &["kind"],
        )
        .map_err(err)?;
        let registry = Registry::new();
        registry.register(Box::new(findings.clone())).map_err(err)?;
        Ok(AuditMetrics {
            registry,
            findings,
            ok: AtomicBool::new(false),
        })
    }

    /// An audit done: its counts exported.
    pub fn record(&self, report: &AuditReport) {
        for kind in FindingKind::ALL {
            let n = report.counts.get(kind.as_str()).copied().unwrap_or(0);
            self.findings
                .with_label_values(&[kind.as_str()])
                .set(n as i64);
        }
        self.ok.store(true, Ordering::Relaxed);
    }

    /// An audit that could not read both stores: the last counts stay, health says so.
    pub fn failed(&self) {
        self.ok.store(false, Ordering::Relaxed);
    }
}

impl crate::app::metrics::Exporter for AuditMetrics {
    fn healthy(&self) -> bool {
        self.ok.load(Ordering::Relaxed)
    }
    fn text(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
    fn unhealthy_reason(&self) -> &'static str {
        "the last audit could not read both stores\n"
    }
}

/// The counts in one line, for `audit --watch` to print when they change.
pub fn counts_line(report: &AuditReport) -> String {
    format!("audit: {}", counts_text(report))
}

/// Every kind's count, zeros too, in one order: `1 split, 0 double, ...`.
pub fn counts_text(report: &AuditReport) -> String {
    FindingKind::ALL
        .iter()
        .map(|k| {
            format!(
                "{} {}",
                report.counts.get(k.as_str()).unwrap_or(&0),
                k.as_str()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

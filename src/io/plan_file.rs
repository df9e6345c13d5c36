//! The plan file: the stable JSON contract between `plan`, the operator's editor and `apply`.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::core::kvstore::SourceInfo;
use crate::core::planner::{PlanItem, summarize};
use crate::core::range::{ClusterScope, IdRange, MaxConnectedClusters};
use crate::error::{Error, Result};

pub const PLAN_VERSION: u32 = 1;

/// Which API server the plan was made against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TargetInfo {
    pub server: String,
    pub context: Option<String>,
}

/// Whether apply must install the CRD first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CrdStep {
    pub present: bool,
    pub create: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    pub version: u32,
    pub created_at: String,
    /// Who made the plan, as the decision log names an operator.
    #[serde(default)]
    pub created_by: String,
    pub source: SourceInfo,
    pub target: TargetInfo,
    pub cluster_id: u32,
    /// Plans made before this field existed were made for the classic 255-cluster layout.
    #[serde(default)]
    pub max_connected_clusters: MaxConnectedClusters,
    pub range: IdRange,
    pub crd: CrdStep,
    pub summary: BTreeMap<String, usize>,
    pub items: Vec<PlanItem>,
}

impl PlanFile {
    pub fn new(
        source: SourceInfo,
        target: TargetInfo,
        scope: ClusterScope,
        crd_present: bool,
        items: Vec<PlanItem>,
    ) -> Self {
        let summary = summarize(&items)
            .into_iter()
            .map(|(k, v)| (k.as_str().to_string(), v))
            .collect();
        PlanFile {
            version: PLAN_VERSION,
            created_at: crate::io::decision_log::now(),
            created_by: super::operator::current(),
            source,
            target,
            cluster_id: scope.cluster_id,
            max_connected_clusters: scope.max_connected_clusters,
            range: scope.range,
            crd: CrdStep {
                present: crd_present,
                create: !crd_present,
            },
            summary,
            items,
        }
    }

    /// Writes the plan to a new file (mode 0600). An existing file is never overwritten.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut f = super::private_file::create_new(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::file(
                path,
                "already exists; plans are never overwritten: choose another --output or remove it",
            ),
            _ => Error::file_io(path, "cannot create plan file", e),
        })?;
        // Streamed to the file: at 65,280 identities the text is 30 MB, never held whole.
        let mut w = std::io::BufWriter::new(&mut f);
        serde_json::to_writer_pretty(&mut w, self).map_err(|e| Error::file_cause(path, e))?;
        w.write_all(b"\n")
            .and_then(|_| w.flush())
            .map_err(|e| Error::file_io(path, "cannot write plan file", e))?;
        drop(w);
        f.sync_all()
            .map_err(|e| Error::file_io(path, "cannot write plan file", e))
    }

    /// Loads and checks a plan file; every problem names the file and, where it has one, the item.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read(path).map_err(|e| Error::PlanFile {
            path: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        })?;
        Self::from_slice(&text).map_err(|message| Error::PlanFile {
            path: path.to_path_buf(),
            message,
        })
    }

    /// The cluster scope the plan was made for.
    pub fn scope(&self) -> Result<ClusterScope, String> {
        ClusterScope::new(self.cluster_id, self.max_connected_clusters)
    }

    pub fn from_slice(text: &[u8]) -> Result<Self, String> {
        // A decision log given as a plan: a line of its own per record, each with its time.
        let is_log = || {
            let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
            serde_json::from_slice::<serde_json::Value>(first)
                .is_ok_and(|v| v.get("ts").is_some() && v.get("version").is_none())
        };
        if is_log() {
            return Err(
                "this is a decision log, not a plan: give it to --resume (apply --resume LOG --yes)".into(),
            );
        }
        let raw: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| format!("not valid JSON: {e}"))?;
        match raw.get("version").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(PLAN_VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "plan version {v} is not supported (this tool reads version {PLAN_VERSION})"
                ));
            }
            None => return Err("no \"version\": not a cilium-idmig plan".into()),
        }
        // Strict, as kubectl's field validation is: a misspelt field (`"acton"`) is refused,
        // never read as absent. Items are read one by one so a refusal names the item.
        let mut raw = raw;
        let items = match raw.get_mut("items") {
            Some(serde_json::Value::Array(items)) => std::mem::take(items),
            Some(_) => return Err("\"items\" is not a list".into()),
            None => return Err("no \"items\": not a cilium-idmig plan".into()),
        };
        let mut plan: PlanFile =
            serde_json::from_value(raw).map_err(|e| format!("not a valid plan: {e}"))?;
        plan.items = items
            .into_iter()
            .enumerate()
            .map(|(n, v)| {
                let id = v
                    .get("id")
                    .map_or_else(|| format!("number {}", n + 1), ToString::to_string);
                let item: PlanItem = serde_json::from_value(v)
                    .map_err(|e| format!("item {id}: {e}; fix the field or remove it"))?;
                if item.kind != crate::core::planner::Kind::Invalid && item.numeric_id().is_none() {
                    return Err(format!(
                        "item {id}: id {:?} is not a kvstore identity's id (a number in the range), yet the plan says it is a {}; check the id for a typo",
                        item.id, item.kind
                    ));
                }
                Ok(item)
            })
            .collect::<Result<_, String>>()?;
        let expected = plan.scope()?.range;
        if plan.range != expected {
            return Err(format!(
                "range {} does not match cluster_id {} with max_connected_clusters {} (expected {expected})",
                plan.range, plan.cluster_id, plan.max_connected_clusters
            ));
        }
        let mut seen = HashSet::new();
        for item in &plan.items {
            if !seen.insert(item.id.as_str()) {
                return Err(format!("item {} appears twice", item.id));
            }
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn sample() -> PlanFile {
        let items = crate::core::planner::plan(
            &[crate::core::kvstore::MasterEntry::new("300", "k8s:a=b;")],
            &crate::core::kvstore::NodeCounts::default(),
            &Default::default(),
            IdRange::for_cluster(0).unwrap(),
        );
        PlanFile::new(
            SourceInfo::default(),
            TargetInfo::default(),
            ClusterScope::new(0, MaxConnectedClusters::C255).unwrap(),
            false,
            items,
        )
    }

    #[test]
    fn saves_0600_never_overwrites_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plan.json");
        let plan = sample();
        plan.save(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let e = plan.save(&p).unwrap_err().to_string();
        assert!(e.contains("never overwritten"), "{e}");
        assert_eq!(PlanFile::load(&p).unwrap(), plan);
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["items"][0]["kind"], "create");
        assert_eq!(v["items"][0]["action"], "create");
        assert_eq!(v["summary"]["create"], 1);
        assert_eq!(v["max_connected_clusters"], 255);
        assert!(v["created_by"].as_str().unwrap().contains('@'));
    }

    #[test]
    fn a_misspelt_field_or_a_malformed_id_is_refused_naming_the_item() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["items"][0]["acton"] = "skip".into();
        let e = PlanFile::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("item \"300\"") && e.contains("acton"), "{e}");
        let mut v = serde_json::to_value(sample()).unwrap();
        v["items"][0]["traget_id"] = 1005.into();
        let e = PlanFile::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("traget_id"), "{e}");
        let mut v = serde_json::to_value(sample()).unwrap();
        v["items"][0]["id"] = "1O05".into();
        let e = PlanFile::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("1O05") && e.contains("typo"), "{e}");
        let mut v = serde_json::to_value(sample()).unwrap();
        v["crd"]["craete"] = true.into();
        let e = PlanFile::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("craete"), "{e}");
    }

    #[test]
    fn the_mesh_layout_is_recorded_and_checked() {
        // A plan written before the field existed reads as the classic layout.
        let mut v = serde_json::to_value(sample()).unwrap();
        v.as_object_mut().unwrap().remove("max_connected_clusters");
        let old = PlanFile::from_slice(v.to_string().as_bytes()).unwrap();
        assert_eq!(old.max_connected_clusters, MaxConnectedClusters::C255);
        // Claiming a 511-cluster mesh with the 255 range of cluster 0 does not add up.
        let mut v = serde_json::to_value(sample()).unwrap();
        v["max_connected_clusters"] = 511.into();
        let e = PlanFile::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("256..=32767"), "{e}");
        v["range"]["max"] = 32767.into();
        let plan = PlanFile::from_slice(v.to_string().as_bytes()).unwrap();
        assert_eq!(plan.scope().unwrap().range.max, 32767);
        v["max_connected_clusters"] = 300.into();
        let e = PlanFile::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("255 (the default) or 511"), "{e}");
    }

    #[test]
    fn refuses_bad_files_with_a_reason() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["version"] = 2.into();
        assert!(
            PlanFile::from_slice(v.to_string().as_bytes())
                .unwrap_err()
                .contains("version 2")
        );
        let mut v = serde_json::to_value(sample()).unwrap();
        v["cluster_id"] = 3.into();
        assert!(
            PlanFile::from_slice(v.to_string().as_bytes())
                .unwrap_err()
                .contains("does not match")
        );
        let mut v = serde_json::to_value(sample()).unwrap();
        let item = v["items"][0].clone();
        v["items"].as_array_mut().unwrap().push(item);
        assert!(
            PlanFile::from_slice(v.to_string().as_bytes())
                .unwrap_err()
                .contains("twice")
        );
        assert!(PlanFile::from_slice(b"{").unwrap_err().contains("JSON"));
        assert!(PlanFile::from_slice(b"{}").unwrap_err().contains("version"));
        let mut v = serde_json::to_value(sample()).unwrap();
        v["items"][0]["action"] = "explode".into();
        assert!(
            PlanFile::from_slice(v.to_string().as_bytes())
                .unwrap_err()
                .contains("explode")
        );
    }
}

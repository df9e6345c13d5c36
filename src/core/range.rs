//! The numeric identity range Cilium allocates from for one cluster ID.

use serde::{Deserialize, Serialize};

/// `MinimalNumericIdentity`: below this, identities are reserved (named, well-known, user-reserved).
pub const MINIMAL_NUMERIC_IDENTITY: u32 = 256;
/// Bits of a cluster-scoped identity: the cluster ID and the local id share 24 bits.
pub const IDENTITY_BITS: u32 = 24;

/// Cilium's `max-connected-clusters` (1.15+): how many clusters a ClusterMesh may join, which
/// sets how many of the 24 identity bits the cluster ID takes. Before 1.15 it is always 255.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(into = "u32", try_from = "u32")]
pub enum MaxConnectedClusters {
    /// 255 (the default): 8 bits of cluster ID, `ClusterIDShift` 16.
    #[default]
    C255,
    /// 511: 9 bits of cluster ID, `ClusterIDShift` 15.
    C511,
}

impl MaxConnectedClusters {
    /// Highest cluster ID (`ClusterIDMax`).
    pub fn max_cluster_id(self) -> u32 {
        match self {
            MaxConnectedClusters::C255 => 255,
            MaxConnectedClusters::C511 => 511,
        }
    }

    /// `ClusterIDShift` = 24 - log2(ClusterIDMax + 1).
    pub fn cluster_id_shift(self) -> u32 {
        IDENTITY_BITS - (self.max_cluster_id() + 1).trailing_zeros()
    }
}

impl From<MaxConnectedClusters> for u32 {
    fn from(m: MaxConnectedClusters) -> u32 {
        m.max_cluster_id()
    }
}

impl TryFrom<u32> for MaxConnectedClusters {
    type Error = String;
    fn try_from(n: u32) -> Result<Self, String> {
        match n {
            255 => Ok(MaxConnectedClusters::C255),
            511 => Ok(MaxConnectedClusters::C511),
            n => Err(format!(
                "max-connected-clusters {n} is not one Cilium accepts: use 255 (the default) or 511"
            )),
        }
    }
}

impl std::str::FromStr for MaxConnectedClusters {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let n: u32 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a number: use 255 or 511"))?;
        MaxConnectedClusters::try_from(n)
    }
}

impl std::fmt::Display for MaxConnectedClusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.max_cluster_id())
    }
}

/// An inclusive range of allocatable identities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub min: u32,
    pub max: u32,
}

impl IdRange {
    /// The range of a cluster ID in the classic layout (`max-connected-clusters` 255).
    pub fn for_cluster(cluster_id: u32) -> Result<Self, String> {
        Self::for_mesh(cluster_id, MaxConnectedClusters::C255)
    }

    /// Cilium's `MinimalAllocationIdentity`..=`MaximumAllocationIdentity` for a cluster ID
    /// in a mesh of `mcc` clusters, with `shift` = `ClusterIDShift`: 256..=`(1 << shift) - 1`
    /// for cluster 0; `id << shift`..=`((id + 1) << shift) - 1` otherwise (no well-known
    /// identities are reserved there).
    pub fn for_mesh(cluster_id: u32, mcc: MaxConnectedClusters) -> Result<Self, String> {
        let max_id = mcc.max_cluster_id();
        if cluster_id > max_id {
            return Err(format!(
                "cluster ID {cluster_id} is out of range: with max-connected-clusters {mcc} Cilium accepts 0..={max_id}{}",
                if max_id == 255 && cluster_id <= 511 {
                    " (pass --max-connected-clusters 511 if the mesh was installed with it)"
                } else {
                    ""
                }
            ));
        }
        let shift = mcc.cluster_id_shift();
        let max = ((cluster_id + 1) << shift) - 1;
        let min = if cluster_id == 0 {
            MINIMAL_NUMERIC_IDENTITY
        } else {
            cluster_id << shift
        };
        Ok(IdRange { min, max })
    }

    pub fn contains(&self, id: u32) -> bool {
        (self.min..=self.max).contains(&id)
    }

    pub fn len(&self) -> u32 {
        self.max - self.min + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Where this cluster sits in its mesh: its cluster ID, the mesh's `max-connected-clusters`,
/// and the identity range the two give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterScope {
    pub cluster_id: u32,
    pub max_connected_clusters: MaxConnectedClusters,
    pub range: IdRange,
}

impl ClusterScope {
    pub fn new(cluster_id: u32, mcc: MaxConnectedClusters) -> Result<Self, String> {
        Ok(ClusterScope {
            cluster_id,
            max_connected_clusters: mcc,
            range: IdRange::for_mesh(cluster_id, mcc)?,
        })
    }
}

impl std::fmt::Display for ClusterScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cluster id {} (max-connected-clusters {}), range {}",
            self.cluster_id, self.max_connected_clusters, self.range
        )
    }
}

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_says_its_cluster_mesh_and_range() {
        let s = ClusterScope::new(0, MaxConnectedClusters::default()).unwrap();
        assert!(!s.range.is_empty());
        assert_eq!(s.range.len(), 65_280);
        let text = s.to_string();
        assert!(
            text.starts_with("cluster id 0 (max-connected-clusters "),
            "{text}"
        );
        assert!(text.contains("range 256"), "{text}");
    }

    #[test]
    fn cluster_ranges_match_cilium() {
        assert_eq!(
            IdRange::for_cluster(0).unwrap(),
            IdRange {
                min: 256,
                max: 65535
            }
        );
        assert_eq!(
            IdRange::for_cluster(1).unwrap(),
            IdRange {
                min: 65536,
                max: 131071
            }
        );
        assert_eq!(
            IdRange::for_cluster(255).unwrap(),
            IdRange {
                min: 255 << 16,
                max: (256 << 16) - 1
            }
        );
        assert!(IdRange::for_cluster(256).is_err());
        assert_eq!(IdRange::for_cluster(0).unwrap().len(), 65280);
    }

    #[test]
    fn a_511_cluster_mesh_takes_nine_bits() {
        let m = MaxConnectedClusters::C511;
        assert_eq!(m.cluster_id_shift(), 15);
        assert_eq!(MaxConnectedClusters::C255.cluster_id_shift(), 16);
        // Cluster 0 ends at 32767: 32768..=65535 belong to cluster 1 in such a mesh.
        assert_eq!(
            IdRange::for_mesh(0, m).unwrap(),
            IdRange {
                min: 256,
                max: 32767
            }
        );
        assert_eq!(
            IdRange::for_mesh(1, m).unwrap(),
            IdRange {
                min: 32768,
                max: 65535
            }
        );
        assert_eq!(
            IdRange::for_mesh(511, m).unwrap(),
            IdRange {
                min: 511 << 15,
                max: (1 << 24) - 1
            }
        );
        assert!(IdRange::for_mesh(512, m).is_err());
        let e = IdRange::for_mesh(300, MaxConnectedClusters::C255).unwrap_err();
        assert!(e.contains("--max-connected-clusters 511"), "{e}");
        assert_eq!("511".parse::<MaxConnectedClusters>().unwrap(), m);
        assert!("256".parse::<MaxConnectedClusters>().is_err());
        assert_eq!(serde_json::to_string(&m).unwrap(), "511");
        assert_eq!(
            serde_json::from_str::<MaxConnectedClusters>("255").unwrap(),
            MaxConnectedClusters::C255
        );
        assert!(serde_json::from_str::<MaxConnectedClusters>("300").is_err());
    }
}

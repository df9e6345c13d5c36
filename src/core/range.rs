//! The numeric identity range Cilium allocates from for one cluster ID.

use serde::{Deserialize, Serialize};

/// Cilium's `ClusterIDShift`: the cluster ID sits above the low 16 bits.
pub const CLUSTER_ID_SHIFT: u32 = 16;
/// `MinimalNumericIdentity`: below this, identities are reserved (named, well-known, user-reserved).
pub const MINIMAL_NUMERIC_IDENTITY: u32 = 256;
/// Highest cluster ID Cilium accepts in its classic 8-bit ClusterMesh layout.
pub const MAX_CLUSTER_ID: u32 = 255;

/// An inclusive range of allocatable identities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub min: u32,
    pub max: u32,
}

impl IdRange {
    /// Cilium's `MinimalAllocationIdentity`..=`MaximumAllocationIdentity` for a cluster ID:
    /// 256..=65535 for cluster 0; `id << 16`..=`((id + 1) << 16) - 1` otherwise (no
    /// well-known identities are reserved there).
    pub fn for_cluster(cluster_id: u32) -> Result<Self, String> {
        if cluster_id > MAX_CLUSTER_ID {
            return Err(format!(
                "cluster ID {cluster_id} is out of range: Cilium accepts 0..={MAX_CLUSTER_ID}"
            ));
        }
        let max = ((cluster_id + 1) << CLUSTER_ID_SHIFT) - 1;
        let min = if cluster_id == 0 {
            MINIMAL_NUMERIC_IDENTITY
        } else {
            cluster_id << CLUSTER_ID_SHIFT
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

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

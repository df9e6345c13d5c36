//! Both sides as an instance was told them (`Shadow`): an account kept apart from the
//! machine's own sets, which the split checks read.

use std::collections::BTreeMap;

use crate::core::kvstore::parse_id;
use crate::core::labels::{LabelKey, valid_label_key};

/// Both sides as an instance was told them.
#[derive(Debug, Default)]
pub(super) struct Shadow {
    pub(super) kv: BTreeMap<u32, Vec<u8>>,
    pub(super) k8s: BTreeMap<u32, LabelKey>,
}

impl Shadow {
    pub(super) fn of(state: &crate::core::sync::SyncState) -> Self {
        Shadow {
            kv: state
                .masters()
                .iter()
                .filter_map(|(id, v)| Some((parse_id(id).ok()?, v.clone())))
                .collect(),
            k8s: state.k8s().clone(),
        }
    }

    pub(super) fn split(&self, id: u32) -> bool {
        match (self.kv.get(&id), self.k8s.get(&id)) {
            (Some(v), Some(l)) => v.as_slice() != l.as_bytes() && valid_label_key(v).is_ok(),
            _ => false,
        }
    }

    pub(super) fn split_ids(&self) -> Vec<u32> {
        self.k8s
            .keys()
            .copied()
            .filter(|id| self.split(*id))
            .collect()
    }
}

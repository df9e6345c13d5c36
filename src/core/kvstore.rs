//! The kvstore layout Cilium uses for identities, and the snapshot read from it (pure data).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Cilium's base path for identities in etcd.
pub const DEFAULT_PREFIX: &str = "cilium/state/identities/v1";

/// The "node" of the `value/` keys that `sync --reserve-in-kvstore` writes: no node can have
/// this name (Kubernetes node names are DNS subdomains, and Cilium names its keys after
/// them, but never with this tool's name). They are not a node's use of an identity, so
/// node counts, node lists and cutover leave them out.
pub const RESERVATION_NODE: &str = "cilium-idmig-sync";

/// What a key under the identities prefix is.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyKind<'a> {
    /// `id/<n>`: the master key; the value is the label key.
    Master { id: &'a [u8] },
    /// `value/<label key>/<node>`: a node's reference; the label key may itself contain `/`,
    /// so the node is whatever follows the last `/`.
    Slave { label_key: &'a [u8], node: &'a [u8] },
    /// `locks/...`: allocator locks, never migrated.
    Lock,
    /// Anything else under the prefix.
    Other,
}

/// Normalises a prefix so that it ends with exactly one `/`.
pub fn normalize_prefix(prefix: &str) -> String {
    format!("{}/", prefix.trim_end_matches('/'))
}

/// Classifies a full etcd key against a normalised prefix (ending in `/`).
pub fn classify_key<'a>(prefix: &str, key: &'a [u8]) -> KeyKind<'a> {
    let Some(rest) = key.strip_prefix(prefix.as_bytes()) else {
        return KeyKind::Other;
    };
    if let Some(id) = rest.strip_prefix(b"id/") {
        return KeyKind::Master { id };
    }
    if let Some(v) = rest.strip_prefix(b"value/") {
        return match v.iter().rposition(|&b| b == b'/') {
            Some(pos) if pos > 0 => KeyKind::Slave {
                label_key: &v[..pos],
                node: &v[pos + 1..],
            },
            _ => KeyKind::Other,
        };
    }
    if rest.starts_with(b"locks/") {
        return KeyKind::Lock;
    }
    KeyKind::Other
}

/// An id as a master key spells it (the `<n>` of `id/<n>`), with no string on the heap:
/// the masters are keyed by those bytes and looked up by number on sync's hot paths.
pub struct IdDigits {
    buf: [u8; 10],
    at: usize,
}

impl IdDigits {
    pub fn of(mut id: u32) -> Self {
        let mut d = IdDigits {
            buf: [0; 10],
            at: 10,
        };
        loop {
            d.at -= 1;
            d.buf[d.at] = b'0' + (id % 10) as u8;
            id /= 10;
            if id == 0 {
                return d;
            }
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII digits were written.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

/// Parses the `<n>` of `id/<n>` strictly: plain decimal as Cilium formats it, no sign, no
/// leading zero, no whitespace, and within 32 bits (the width of a numeric identity).
pub fn parse_id(raw: &[u8]) -> Result<u32, String> {
    // The common case, read straight from the digits: every plan and change reads ids.
    if let [first @ b'1'..=b'9', rest @ ..] = raw
        && rest.len() < 9
        && rest.iter().all(u8::is_ascii_digit)
    {
        return Ok(rest
            .iter()
            .fold(u32::from(first - b'0'), |n, d| n * 10 + u32::from(d - b'0')));
    }
    let s = std::str::from_utf8(raw).map_err(|_| "id is not valid UTF-8".to_string())?;
    if s.is_empty() {
        return Err("id is empty".into());
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("id {s:?} is not a plain decimal number"));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(format!(
            "id {s:?} has a leading zero; Cilium never writes one"
        ));
    }
    s.parse::<u32>()
        .map_err(|_| format!("id {s} does not fit in 32 bits"))
}

/// One `id/<n>` entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterEntry {
    pub id: Vec<u8>,
    pub value: Vec<u8>,
}

impl MasterEntry {
    pub fn new(id: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        MasterEntry {
            id: id.into(),
            value: value.into(),
        }
    }
}

/// Where a snapshot came from, for the plan file and the preflight screen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SourceInfo {
    pub endpoints: Vec<String>,
    pub revision: i64,
    pub prefix: String,
}

/// A consistent read of the identities in the kvstore at one revision.
#[derive(Debug, Clone, Default)]
pub struct KvSnapshot {
    pub source: SourceInfo,
    pub masters: Vec<MasterEntry>,
    /// Number of `value/` keys per label key: how many nodes use each identity.
    pub node_counts: NodeCounts,
}

/// Nodes using each label key. Keyed by a 64-bit hash of the label key rather than a copy
/// of it: at 65,280 identities the copies cost 18 MiB, the hashes 2. Two label keys sharing
/// a hash (about one chance in 10^10 at that size) would only show one node count for both;
/// no write depends on a count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounts {
    by_label: HashMap<u64, u32, Prehashed>,
    /// `value/` keys per identity (label key and the id the key holds): what a plan shows
    /// for an id. Two kvstore ids with one label set are used by different nodes.
    by_identity: HashMap<u64, u32, Prehashed>,
    /// `value/` keys per node: the nodes still in kvstore mode (their keys live on leases
    /// that lapse once an agent leaves kvstore mode).
    by_node: BTreeMap<String, u32>,
}

/// The counts' keys are hashes already: the map takes them as they are rather than hash
/// them a second time.
type Prehashed = std::hash::BuildHasherDefault<PassThrough>;

#[derive(Debug, Default)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys reach here; any other input still hashes, if slowly.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The seed of the label keys' hashes: fixed, so a count is keyed alike in every process
/// (a replayed simulation sees the same maps).
const COUNT_SEED: u64 = 0x6964_6d69_6700_0001;

impl NodeCounts {
    /// A label key's hash.
    fn hash_label(label_key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        foldhash::quality::FixedState::with_seed(COUNT_SEED).hash_one(label_key)
    }

    /// An identity's hash: its id's, seeded by its label key's (the label key is not read
    /// twice).
    fn hash_identity(label: u64, id: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        foldhash::quality::FixedState::with_seed(label).hash_one(id)
    }

    /// One fewer at `h`; a count that reaches 0 goes.
    fn one_less(counts: &mut HashMap<u64, u32, Prehashed>, h: u64) {
        if let Some(n) = counts.get_mut(&h) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&h);
            }
        }
    }

    pub fn with_capacity(n: usize) -> Self {
        NodeCounts {
            by_label: HashMap::with_capacity_and_hasher(n, Prehashed::default()),
            by_identity: HashMap::with_capacity_and_hasher(n, Prehashed::default()),
            by_node: BTreeMap::new(),
        }
    }

    /// Nodes whose `value/` key for `label_key` holds `id` (0 when none).
    pub fn of_identity(&self, label_key: &[u8], id: &[u8]) -> u32 {
        self.by_identity
            .get(&Self::hash_identity(Self::hash_label(label_key), id))
            .copied()
            .unwrap_or(0)
    }

    /// Nodes using `label_key` (0 when none).
    pub fn get(&self, label_key: &[u8]) -> u32 {
        self.by_label
            .get(&Self::hash_label(label_key))
            .copied()
            .unwrap_or(0)
    }

    /// Adds `n` nodes to `label_key` at `id` (node names unknown, as in generated data).
    pub fn add(&mut self, label_key: &[u8], id: &[u8], n: u32) {
        let label = Self::hash_label(label_key);
        *self.by_label.entry(label).or_default() += n;
        *self
            .by_identity
            .entry(Self::hash_identity(label, id))
            .or_default() += n;
    }

    /// One `value/` key: `node` uses `label_key`, the key holding `id` (sync's own
    /// reservations are no node's use).
    pub fn add_key(&mut self, label_key: &[u8], node: &[u8], id: &[u8]) {
        if node == RESERVATION_NODE.as_bytes() {
            return;
        }
        self.add(label_key, id, 1);
        // A node is named by most keys of a read: its name is allocated once, not per key.
        let name = String::from_utf8_lossy(node);
        match self.by_node.get_mut(name.as_ref()) {
            Some(n) => *n += 1,
            None => {
                self.by_node.insert(name.into_owned(), 1);
            }
        }
    }

    /// Adds another count of other `value/` keys (a read in parts, each counted apart).
    pub fn merge(&mut self, other: NodeCounts) {
        for (h, n) in other.by_label {
            *self.by_label.entry(h).or_default() += n;
        }
        for (h, n) in other.by_identity {
            *self.by_identity.entry(h).or_default() += n;
        }
        for (node, n) in other.by_node {
            *self.by_node.entry(node).or_default() += n;
        }
    }

    /// One `value/` key gone (its lease lapsed, or the agent released the identity); `id`:
    /// what it held, where the watch says (etcd's previous value of a deleted key).
    pub fn remove_key(&mut self, label_key: &[u8], node: &[u8], id: Option<&[u8]>) {
        if node == RESERVATION_NODE.as_bytes() {
            return;
        }
        let label = Self::hash_label(label_key);
        Self::one_less(&mut self.by_label, label);
        if let Some(id) = id {
            Self::one_less(&mut self.by_identity, Self::hash_identity(label, id));
        }
        let node = String::from_utf8_lossy(node);
        if let Some(n) = self.by_node.get_mut(node.as_ref()) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_node.remove(node.as_ref());
            }
        }
    }

    /// The nodes with at least one `value/` key: those still in kvstore mode.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.by_node.keys().map(String::as_str)
    }

    /// Label keys with at least one node.
    pub fn len(&self) -> usize {
        self.by_label.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_label.is_empty()
    }

    /// `value/` keys counted in all.
    pub fn total(&self) -> u64 {
        self.by_label.values().map(|&n| u64::from(n)).sum()
    }
}

/// Node counts as the planner reads them: a snapshot's, or a plain map in tests and
/// generated data.
pub trait NodesOf {
    /// Nodes whose `value/` key for `label_key` holds `id`.
    fn nodes_of(&self, label_key: &[u8], id: &[u8]) -> u32;
}

impl NodesOf for NodeCounts {
    fn nodes_of(&self, label_key: &[u8], id: &[u8]) -> u32 {
        self.of_identity(label_key, id)
    }
}

/// Counts per label set (tests and generated data, where each set has one id).
impl NodesOf for HashMap<Vec<u8>, u32> {
    fn nodes_of(&self, label_key: &[u8], _id: &[u8]) -> u32 {
        self.get(label_key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_spelled_as_its_master_key_and_reads_back() {
        for id in [0, 7, 10, 256, 65_535, 99_999, u32::MAX] {
            let d = IdDigits::of(id);
            assert_eq!(d.as_str(), id.to_string());
            assert_eq!(parse_id(d.as_bytes()), Ok(id));
        }
    }

    #[test]
    fn a_value_key_needs_a_label_key_before_its_node() {
        let p = "cilium/state/identities/v1/";
        assert!(matches!(
            classify_key(p, b"cilium/state/identities/v1/value/k8s:a=1;/node-1"),
            KeyKind::Slave {
                label_key: b"k8s:a=1;",
                node: b"node-1"
            }
        ));
        assert!(matches!(
            classify_key(p, b"cilium/state/identities/v1/value//node-1"),
            KeyKind::Other
        ));
    }

    #[test]
    fn counts_made_in_parts_and_merged_are_the_counts_made_whole() {
        let keys: [(&[u8], &[u8], &[u8]); 6] = [
            (b"k8s:a=1;", b"node-1", b"300"),
            (b"k8s:a=1;", b"node-2", b"300"),
            (b"k8s:a=1;", b"node-3", b"301"),
            (b"k8s:b=1;", b"node-1", b"302"),
            (b"k8s:b=1;", RESERVATION_NODE.as_bytes(), b"302"),
            (b"k8s:c=1;", b"node-2", b"303"),
        ];
        let mut whole = NodeCounts::with_capacity(4);
        for (l, n, id) in keys {
            whole.add_key(l, n, id);
        }
        for split in 0..=keys.len() {
            let (mut low, mut high) = (NodeCounts::default(), NodeCounts::default());
            for (l, n, id) in &keys[..split] {
                low.add_key(l, n, id);
            }
            for (l, n, id) in &keys[split..] {
                high.add_key(l, n, id);
            }
            low.merge(high);
            assert_eq!(low, whole, "split at {split}");
        }
        assert_eq!(whole.get(b"k8s:a=1;"), 3);
        assert_eq!(whole.of_identity(b"k8s:a=1;", b"301"), 1);
        assert_eq!(whole.nodes().count(), 3);
    }

    #[test]
    fn a_node_stays_in_kvstore_mode_until_its_last_key_goes() {
        let mut c = NodeCounts::with_capacity(4);
        assert!(c.is_empty());
        c.add_key(b"k8s:a=1;", b"node-1", b"300");
        c.add_key(b"k8s:b=1;", b"node-1", b"301");
        c.add_key(b"k8s:a=1;", RESERVATION_NODE.as_bytes(), b"300");
        assert!(!c.is_empty());
        assert_eq!(
            c.nodes().collect::<Vec<_>>(),
            ["node-1"],
            "sync's reservations are no node"
        );
        c.remove_key(b"k8s:a=1;", b"node-1", Some(b"300"));
        assert_eq!(c.nodes().collect::<Vec<_>>(), ["node-1"]);
        c.remove_key(b"k8s:b=1;", b"node-1", None);
        assert_eq!(c.nodes().count(), 0);
        assert!(c.is_empty());
    }

    #[test]
    fn node_counts_are_kept_per_label_key_without_copying_it() {
        let mut c = NodeCounts::default();
        c.add(b"k8s:a=1;", b"300", 1);
        c.add(b"k8s:a=1;", b"300", 2);
        c.add(b"k8s:a=2;", b"301", 1);
        assert_eq!(
            (c.get(b"k8s:a=1;"), c.get(b"k8s:a=2;"), c.get(b"k8s:a=3;")),
            (3, 1, 0)
        );
        assert_eq!((c.len(), c.total()), (2, 4));
        // Keys with their nodes: the nodes still in kvstore mode, and what lapses.
        let mut k = NodeCounts::default();
        k.add_key(b"k8s:a=1;", b"10.0.0.1", b"300");
        k.add_key(b"k8s:a=2;", b"10.0.0.1", b"301");
        k.add_key(b"k8s:a=1;", b"10.0.0.2", b"300");
        assert_eq!(k.nodes().collect::<Vec<_>>(), ["10.0.0.1", "10.0.0.2"]);
        k.remove_key(b"k8s:a=1;", b"10.0.0.2", Some(b"300"));
        assert_eq!((k.get(b"k8s:a=1;"), k.nodes().count()), (1, 1));
        k.remove_key(b"k8s:a=1;", b"10.0.0.1", Some(b"300"));
        k.remove_key(b"k8s:a=2;", b"10.0.0.1", Some(b"301"));
        assert!(k.is_empty() && k.nodes().next().is_none());
        let m: HashMap<Vec<u8>, u32> =
            [(b"k8s:a=1;".to_vec(), 3), (b"k8s:a=2;".to_vec(), 1)].into();
        assert_eq!(
            m.nodes_of(b"k8s:a=1;", b"300"),
            c.nodes_of(b"k8s:a=1;", b"300")
        );
    }

    #[test]
    fn nodes_are_counted_per_id_where_one_label_set_has_two() {
        // The kvstore holds k8s:a=1; under 1100 and 1101: node 1's key names 1100, node 2's
        // 1101. Each id is used by one node; the label set by two.
        let mut c = NodeCounts::default();
        c.add_key(b"k8s:a=1;", b"10.0.0.1", b"1100");
        c.add_key(b"k8s:a=1;", b"10.0.0.2", b"1101");
        assert_eq!(c.nodes_of(b"k8s:a=1;", b"1101"), 1);
        assert_eq!(c.nodes_of(b"k8s:a=1;", b"1100"), 1);
        assert_eq!(c.get(b"k8s:a=1;"), 2);
        c.remove_key(b"k8s:a=1;", b"10.0.0.2", Some(b"1101"));
        assert_eq!(c.nodes_of(b"k8s:a=1;", b"1101"), 0);
        assert_eq!(c.nodes_of(b"k8s:a=1;", b"1100"), 1);
    }

    #[test]
    fn classifies_keys() {
        let p = normalize_prefix("cilium/state/identities/v1/");
        assert_eq!(p, "cilium/state/identities/v1/");
        assert_eq!(
            classify_key(&p, b"cilium/state/identities/v1/id/300"),
            KeyKind::Master { id: b"300" }
        );
        assert_eq!(
            classify_key(&p, b"cilium/state/identities/v1/value/k8s:a=b/c;/node-1"),
            KeyKind::Slave {
                label_key: b"k8s:a=b/c;",
                node: b"node-1"
            }
        );
        assert_eq!(
            classify_key(&p, b"cilium/state/identities/v1/locks/x"),
            KeyKind::Lock
        );
        assert_eq!(
            classify_key(&p, b"cilium/state/identities/v1/value/nolash"),
            KeyKind::Other
        );
        assert_eq!(classify_key(&p, b"elsewhere/id/1"), KeyKind::Other);
    }

    #[test]
    fn parses_ids_strictly() {
        assert_eq!(parse_id(b"300"), Ok(300));
        assert_eq!(parse_id(b"0"), Ok(0));
        assert_eq!(parse_id(b"4294967295"), Ok(u32::MAX));
        for n in [
            1,
            9,
            10,
            256,
            65_535,
            99_999_999,
            999_999_999,
            1_000_000_000,
            4_000_000_001,
        ] {
            assert_eq!(parse_id(n.to_string().as_bytes()), Ok(n));
        }
        for bad in [
            &b""[..],
            b"30 ",
            b"3000000000000",
            b"+300",
            b"-1",
            b"0300",
            b" 300",
            b"30x",
            b"4294967296",
            b"\xff",
        ] {
            assert!(parse_id(bad).is_err(), "{bad:?}");
        }
    }
}

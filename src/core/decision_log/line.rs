//! One line of the decision log: the record (its methods beside the log's reading, in
//! `decision_log`), spelled by hand byte for byte as `serde_json` spells it, and read back
//! by hand when it is spelled so (any other line is serde's to read): tests hold both equal
//! to serde on any record and on any line. Every start reads its logs whole, and serde's
//! general reading and per-byte escaping were a seventh of a simulated seed.

use serde::{Deserialize, Serialize};

use crate::core::kvstore::IdDigits;
use crate::core::outcome::Outcome;
use crate::core::planner::Kind;

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub ts: String,
    pub operator: String,
    pub id: String,
    pub labels: String,
    pub kind: Kind,
    /// The decision as text, for a person: `create (operator)`, or an operator's action in
    /// the TUI, `edit (create 4000)`.
    pub decision: String,
    /// The same decision as fields, which a resume reads: who decided (`operator`,
    /// `accept-proposals`, `proposal`, `rule`) and the action (`create`, `none`, `map`,
    /// `skip`, `undo`, or what a rollback, a moot closing or a reservation did), the target
    /// being `target_id`. Absent in logs written before; those are read from the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    pub target_id: Option<u32>,
    /// Absent on a pure decision record.
    pub outcome: Option<Outcome>,
    pub error: Option<String>,
    /// On `created`: the object's uid and resourceVersion as the API server returned them,
    /// so `rollback` deletes exactly that object (absent in logs written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// A write or delete in the kvstore (`sync --reserve-in-kvstore` only): the keys, the
    /// revision and what happened. Such a line carries no outcome: it serves no identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvstore: Option<String>,
    /// For a reservation: the revision its master key was written at, so that a later sync
    /// can tell the key is still the one written (and its own to keep or release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvstore_revision: Option<i64>,
}

/// `record` as one line of the log: its JSON, then a newline. Cannot fail, unlike serde's.
pub fn record_line(r: &Record) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(192 + r.ts.len() + r.operator.len() + r.labels.len() + r.decision.len());
    field(&mut out, b"{\"ts\":", &r.ts);
    field(&mut out, b",\"operator\":", &r.operator);
    field(&mut out, b",\"id\":", &r.id);
    field(&mut out, b",\"labels\":", &r.labels);
    field(&mut out, b",\"kind\":", r.kind.as_str());
    field(&mut out, b",\"decision\":", &r.decision);
    // Left out when absent, as the struct's serde attributes say; the others are `null`.
    if let Some(by) = &r.decided_by {
        field(&mut out, b",\"decided_by\":", by);
    }
    if let Some(action) = &r.action {
        field(&mut out, b",\"action\":", action);
    }
    out.extend_from_slice(b",\"target_id\":");
    match r.target_id {
        Some(t) => out.extend_from_slice(IdDigits::of(t).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"outcome\":");
    match r.outcome {
        Some(o) => string(&mut out, o.as_str()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"error\":");
    match &r.error {
        Some(e) => string(&mut out, e),
        None => out.extend_from_slice(b"null"),
    }
    if let Some(uid) = &r.uid {
        field(&mut out, b",\"uid\":", uid);
    }
    if let Some(rv) = &r.resource_version {
        field(&mut out, b",\"resource_version\":", rv);
    }
    if let Some(kvstore) = &r.kvstore {
        field(&mut out, b",\"kvstore\":", kvstore);
    }
    if let Some(rev) = r.kvstore_revision {
        out.extend_from_slice(b",\"kvstore_revision\":");
        number(&mut out, rev);
    }
    out.extend_from_slice(b"}\n");
    out
}

/// A field: its name as written before the value (`,"name":`), then the value as a string.
fn field(out: &mut Vec<u8>, name: &[u8], value: &str) {
    out.extend_from_slice(name);
    string(out, value);
}

fn number(out: &mut Vec<u8>, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes is a control byte, `"` or `\`: the only ones JSON escapes
/// (serde_json leaves DEL and every non-ASCII byte as they are).
fn any_to_escape(w: u64) -> bool {
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    let zero_in = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    (below_space | zero_in(quote) | zero_in(backslash)) != 0
}

/// Whether `bytes` hold any byte to escape, read eight at a time; the last few are read as
/// a word filled out with a letter (most strings are short, so the tail is much of them).
fn needs_escape(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Some(w) = word_at(bytes, at) {
        if any_to_escape(w) {
            return true;
        }
        at += 8;
    }
    let mut w = [b'a'; 8];
    for (to, from) in w.iter_mut().zip(&bytes[at..]) {
        *to = *from;
    }
    any_to_escape(u64::from_le_bytes(w))
}

/// The eight bytes from `at` as one word, if there are eight.
fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let w: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(w))
}

/// `s` as a JSON string, escaped as serde_json escapes: the short forms where JSON has
/// them, `\u00xx` (lowercase) for the other control bytes.
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.push(b'"');
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut from = 0;
    for (at, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x20.. => continue,
            _ => 0,
        };
        out.extend_from_slice(&bytes[from..at]);
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            let hex = [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]];
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', hex[0], hex[1]]);
        }
        from = at + 1;
    }
    out.extend_from_slice(&bytes[from..]);
    out.push(b'"');
}

/// The record on `text`, a line without its newline, when it is spelled exactly as
/// `record_line` spells one (no escape in any string); `None` for any other line, which
/// serde then reads (or finds damaged) as it always has. So where this answers, it answers
/// as serde would.
pub fn read_record_line(text: &str) -> Option<Record> {
    let mut at = Cursor {
        text,
        s: text.as_bytes(),
        at: 0,
    };
    at.eat(b"{\"ts\":")?;
    let ts = at.string()?;
    at.eat(b",\"operator\":")?;
    let operator = at.string()?;
    at.eat(b",\"id\":")?;
    let id = at.string()?;
    at.eat(b",\"labels\":")?;
    let labels = at.string()?;
    at.eat(b",\"kind\":")?;
    let kind = kind_named(at.text()?)?;
    at.eat(b",\"decision\":")?;
    let decision = at.string()?;
    let decided_by = at.optional(b",\"decided_by\":")?;
    let action = at.optional(b",\"action\":")?;
    at.eat(b",\"target_id\":")?;
    let target_id = match at.null() {
        true => None,
        false => Some(u32::try_from(at.number()?).ok()?),
    };
    at.eat(b",\"outcome\":")?;
    let outcome = match at.null() {
        true => None,
        false => Some(outcome_named(at.text()?)?),
    };
    at.eat(b",\"error\":")?;
    let error = match at.null() {
        true => None,
        false => Some(at.string()?),
    };
    let uid = at.optional(b",\"uid\":")?;
    let resource_version = at.optional(b",\"resource_version\":")?;
    let kvstore = at.optional(b",\"kvstore\":")?;
    let kvstore_revision = match at.eat(b",\"kvstore_revision\":") {
        Some(()) => Some(at.number()?),
        None => None,
    };
    at.eat(b"}")?;
    (at.at == at.s.len()).then_some(Record {
        ts,
        operator,
        id,
        labels,
        kind,
        decision,
        decided_by,
        action,
        target_id,
        outcome,
        error,
        uid,
        resource_version,
        kvstore,
        kvstore_revision,
    })
}

fn kind_named(name: &str) -> Option<Kind> {
    Kind::EVERY.into_iter().find(|k| k.as_str() == name)
}

fn outcome_named(name: &str) -> Option<Outcome> {
    Outcome::ALL.into_iter().find(|o| o.as_str() == name)
}

/// Where the reading of a line is; each step answers `None` when the line is not spelled
/// as `record_line` spells it.
struct Cursor<'a> {
    text: &'a str,
    s: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// Steps over `expected` if the line goes on with it.
    fn eat(&mut self, expected: &[u8]) -> Option<()> {
        let rest = self.s.get(self.at..)?;
        rest.starts_with(expected)
            .then(|| self.at += expected.len())
    }

    fn null(&mut self) -> bool {
        self.eat(b"null").is_some()
    }

    /// A string with nothing escaped in it, borrowed.
    fn text(&mut self) -> Option<&'a str> {
        self.eat(b"\"")?;
        let start = self.at;
        let bytes = self.s.get(start..)?;
        // Eight bytes at a time up to the word with the closing quote (or an escape, or a
        // control byte, which serde would reject), then a byte at a time.
        let mut end = 0;
        while let Some(w) = word_at(bytes, end) {
            if any_to_escape(w) {
                break;
            }
            end += 8;
        }
        let len = end
            + bytes
                .get(end..)?
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if bytes[len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        // The line is text already, and a quote both starts and ends a whole character.
        self.text.get(start..start + len)
    }

    fn string(&mut self) -> Option<String> {
        self.text().map(str::to_owned)
    }

    /// An optional field left out when absent: `None` means the line is not ours to read,
    /// `Some(None)` that the field is not there.
    fn optional(&mut self, name: &[u8]) -> Option<Option<String>> {
        match self.eat(name) {
            Some(()) => self.string().map(Some),
            None => Some(None),
        }
    }

    /// A whole number as `record_line` writes one: no leading zero, no `-0`.
    fn number(&mut self) -> Option<i64> {
        let negative = self.eat(b"-").is_some();
        let digits = self.s.get(self.at..)?;
        let len = digits
            .iter()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(digits.len());
        if len == 0 || len > 19 || (digits[0] == b'0' && (len > 1 || negative)) {
            return None;
        }
        let mut n: i64 = 0;
        for d in &digits[..len] {
            n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
        }
        self.at += len;
        Some(if negative { -n } else { n })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::outcome::Outcome;
    use crate::core::planner::Kind;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        // Control bytes, quotes, backslashes, DEL, non-ASCII, and runs long enough for the
        // eight-byte steps to meet an escape at every offset.
        prop::collection::vec(
            prop_oneof![
                4 => "[a-z:=;.0-9/-]{0,12}",
                1 => prop::sample::select(vec![
                    "\"", "\\", "\n", "\r", "\t", "\u{8}", "\u{c}", "\u{0}", "\u{1f}", "\u{7f}",
                    "é", "🙂", "\u{2028}",
                ])
                .prop_map(String::from),
            ],
            0..12,
        )
        .prop_map(|parts| parts.concat())
    }

    fn opt<T: std::fmt::Debug + Clone>(
        s: impl Strategy<Value = T>,
    ) -> impl Strategy<Value = Option<T>> {
        prop::option::of(s)
    }

    prop_compose! {
        fn any_record()(
            strings in prop::collection::vec(text(), 5),
            optional in (opt(text()), opt(text()), opt(text()), opt(text()), opt(text()), opt(text())),
            target_id in opt(any::<u32>()),
            kvstore_revision in opt(any::<i64>()),
            kind in prop::sample::select(vec![
                Kind::AlreadyMigrated, Kind::Create, Kind::Remap, Kind::Reuse, Kind::Duplicate,
                Kind::Invalid, Kind::SwitchCreate, Kind::SwitchRemoveDuplicate,
                Kind::SwitchRemoveUnused,
            ]),
            outcome in opt(prop::sample::select(Outcome::ALL.to_vec())),
        ) -> Record {
            let (decided_by, action, error, uid, resource_version, kvstore) = optional;
            let [ts, operator, id, labels, decision] = strings.try_into().unwrap();
            let mut r = Record::new(&id, &labels, kind, decision, target_id);
            (r.ts, r.operator, r.outcome, r.error) = (ts, operator, outcome, error);
            (r.decided_by, r.action, r.kvstore_revision) = (decided_by, action, kvstore_revision);
            (r.uid, r.resource_version, r.kvstore) = (uid, resource_version, kvstore);
            r
        }
    }

    proptest! {
        #[test]
        fn a_line_is_spelled_as_serde_json_spells_the_record(r in any_record()) {
            let mut by_serde = serde_json::to_vec(&r).unwrap();
            by_serde.push(b'\n');
            prop_assert_eq!(
                String::from_utf8(record_line(&r)).unwrap(),
                String::from_utf8(by_serde).unwrap()
            );
        }
    }

    /// A line edited at one place: a span cut, or a token put in, at character boundaries;
    /// `seam`: right after a `:`, `,` or `"`, where a value or a name starts or ends.
    fn edited(line: &str, at: usize, seam: bool, cut: usize, token: &str) -> String {
        let chars: Vec<char> = line.chars().collect();
        let seams: Vec<usize> = (0..chars.len())
            .filter(|&i| matches!(chars[i], ':' | ',' | '"'))
            .map(|i| i + 1)
            .collect();
        let at = match seam {
            true => seams[at % seams.len()],
            false => at % (chars.len() + 1),
        };
        let cut = cut.min(chars.len() - at);
        let mut out: String = chars[..at].iter().collect();
        out.push_str(token);
        out.extend(&chars[at + cut..]);
        out
    }

    proptest! {
        #[test]
        fn a_line_read_by_hand_is_read_as_serde_reads_it(
            r in any_record(),
            at in any::<usize>(),
            seam in any::<bool>(),
            cut in 0usize..4,
            token in prop::sample::select(vec![
                "", "\"", "\\", ",", "}", "{", "0", "-", "1", "null", " ", "\"x\"", ":",
                ",\"uid\":\"a\"", ",\"extra\":1", "\u{1}", "é", "-0", "00", "99999999999",
            ]),
        ) {
            let whole = String::from_utf8(record_line(&r)).unwrap();
            let whole = whole.trim_end();
            // Unedited, a line is read by hand unless a string in it has an escape.
            let escapes = whole.contains('\\');
            prop_assert_eq!(read_record_line(whole), (!escapes).then(|| r.clone()));
            // Edited anywhere, a line read by hand is what serde reads.
            let line = edited(whole, at, seam, cut, token);
            if let Some(mine) = read_record_line(&line) {
                let theirs = serde_json::from_str::<Record>(&line);
                prop_assert!(theirs.is_ok(), "serde: {:?} on {}", theirs, line);
                prop_assert_eq!(mine, theirs.unwrap());
            }
        }
    }

    #[test]
    fn a_number_is_read_by_hand_only_as_serde_reads_it() {
        let numbers = [
            "0",
            "00",
            "01",
            "-0",
            "-1",
            "1",
            "4294967295",
            "4294967296",
            "1.0",
            "1e3",
            "+1",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
        ];
        for n in numbers {
            for line in [
                format!(
                    r#"{{"ts":"t","operator":"o","id":"1","labels":"l","kind":"create","decision":"d","target_id":{n},"outcome":null,"error":null}}"#
                ),
                format!(
                    r#"{{"ts":"t","operator":"o","id":"1","labels":"l","kind":"create","decision":"d","target_id":null,"outcome":null,"error":null,"kvstore_revision":{n}}}"#
                ),
            ] {
                let theirs = serde_json::from_str::<Record>(&line).ok();
                match read_record_line(&line) {
                    Some(mine) => assert_eq!(Some(mine), theirs, "{line}"),
                    None => assert!(
                        n.contains(['.', 'e', '+', '-']) || theirs.is_none() || n.len() > 18,
                        "{line}"
                    ),
                }
            }
        }
    }

    #[test]
    fn every_escape_is_found_at_every_offset_of_a_word() {
        for b in 0u8..=0x7f {
            for offset in 0..17 {
                let mut s = "a".repeat(offset);
                s.push(char::from(b));
                s.push_str("bcdefghijk");
                let mut mine = Vec::new();
                string(&mut mine, &s);
                assert_eq!(
                    mine,
                    serde_json::to_vec(&s).unwrap(),
                    "byte {b:#x} at {offset}"
                );
            }
        }
        for n in [0, 1, -1, i64::MAX, i64::MIN, 4_294_967_295] {
            let mut mine = Vec::new();
            number(&mut mine, n);
            assert_eq!(mine, serde_json::to_vec(&n).unwrap());
        }
    }

    #[test]
    fn every_kind_is_read_back_by_the_name_serde_gives_it() {
        for (i, k) in Kind::EVERY.into_iter().enumerate() {
            // A kind added to the enum fails to build here until it is placed in EVERY.
            let place = match k {
                Kind::AlreadyMigrated => 0,
                Kind::Create => 1,
                Kind::Remap => 2,
                Kind::Reuse => 3,
                Kind::Duplicate => 4,
                Kind::Invalid => 5,
                Kind::SwitchCreate => 6,
                Kind::SwitchRemoveDuplicate => 7,
                Kind::SwitchRemoveUnused => 8,
            };
            assert_eq!(place, i, "{k:?} out of its place in EVERY");
            let name = serde_json::to_string(&k).unwrap();
            assert_eq!(name, format!("\"{}\"", k.as_str()));
            assert_eq!(kind_named(k.as_str()), Some(k));
        }
        assert_eq!(kind_named("no-such-kind"), None);
    }
}

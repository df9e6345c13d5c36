//! The key table: the single source for dispatching keys, the footer and the `?` help.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::model::Screen;

/// What a key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAction {
    Quit,
    Help,
    NextScreen,
    Go(Screen),
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    CycleFilter,
    Search,
    CycleSort,
    ReverseSort,
    Open,
    NextConflict,
    PrevConflict,
    Accept,
    EditTarget,
    Reuse,
    Skip,
    CreateAnyway,
    Undo,
    AcceptAll,
    Commit,
    Stop,
    Pause,
    StartSync,
    Bulk,
    Retry,
    Rescan,
    Export,
    IncludeInUse,
    Audit,
    /// Read the switch report again.
    SwitchReport,
}

/// Where a binding applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Global,
    On(Screen),
}

pub struct Binding {
    pub scope: Scope,
    pub keys: &'static [(KeyCode, KeyModifiers)],
    /// How the footer and help show the keys.
    pub label: &'static str,
    /// The footer's word or two for it.
    pub short: &'static str,
    pub action: KeyAction,
    pub help: &'static str,
}

const N: KeyModifiers = KeyModifiers::NONE;
const S: KeyModifiers = KeyModifiers::SHIFT;
const C: KeyModifiers = KeyModifiers::CONTROL;
use KeyCode::*;

const PREFLIGHT: Scope = Scope::On(Screen::Preflight);
const LIST: Scope = Scope::On(Screen::Identities);
const CONF: Scope = Scope::On(Screen::Conflicts);
const COMMIT: Scope = Scope::On(Screen::Commit);
const ROLLBACK: Scope = Scope::On(Screen::Rollback);
const SYNC: Scope = Scope::On(Screen::Sync);
const AUDIT: Scope = Scope::On(Screen::Audit);
const SWITCH: Scope = Scope::On(Screen::Switch);
const FLEET: Scope = Scope::On(Screen::Fleet);

pub const BINDINGS: &[Binding] = &[
    Binding {
        scope: Scope::Global,
        keys: &[(Char('?'), N), (Char('?'), S)],
        label: "?",
        short: "help",
        action: KeyAction::Help,
        help: "help (this screen)",
    },
    Binding {
        scope: COMMIT,
        keys: &[(Char('c'), C)],
        label: "Ctrl-C",
        short: "stop+quit",
        action: KeyAction::Stop,
        help: "stop writing, then quit: in-flight writes finish",
    },
    Binding {
        scope: COMMIT,
        keys: &[(Char('p'), N)],
        label: "p",
        short: "pause",
        action: KeyAction::Pause,
        help: "pause: stop writing and stay; r resumes",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('q'), N), (Esc, N), (Char('c'), C)],
        label: "q",
        short: "quit",
        action: KeyAction::Quit,
        help: "quit (Esc closes a popup first; from a fleet, goes back)",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Tab, N)],
        label: "Tab",
        short: "next screen",
        action: KeyAction::NextScreen,
        help: "next screen",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('1'), N)],
        label: "1",
        short: "preflight",
        action: KeyAction::Go(Screen::Preflight),
        help: "preflight",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('2'), N)],
        label: "2",
        short: "identities",
        action: KeyAction::Go(Screen::Identities),
        help: "identities",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('3'), N)],
        label: "3",
        short: "conflicts",
        action: KeyAction::Go(Screen::Conflicts),
        help: "conflict review",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('4'), N)],
        label: "4",
        short: "commit",
        action: KeyAction::Go(Screen::Commit),
        help: "commit",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('5'), N)],
        label: "5",
        short: "sync",
        action: KeyAction::Go(Screen::Sync),
        help: "sync: follow the rollout",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('6'), N)],
        label: "6",
        short: "audit",
        action: KeyAction::Go(Screen::Audit),
        help: "audit both stores by labels (reads only)",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('7'), N)],
        label: "7",
        short: "switch",
        action: KeyAction::Go(Screen::Switch),
        help: "the switch to operator-managed identities (reads only)",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('R'), S), (Char('R'), N)],
        label: "R",
        short: "rescan",
        action: KeyAction::Rescan,
        help: "rescan both sides (keeps decisions of unchanged items)",
    },
    Binding {
        scope: Scope::Global,
        keys: &[(Char('x'), N)],
        label: "x",
        short: "export",
        action: KeyAction::Export,
        help: "export the decision log and a Markdown summary",
    },
    Binding {
        scope: LIST,
        keys: &[(Enter, N)],
        label: "Enter",
        short: "details",
        action: KeyAction::Open,
        help: "details of this identity (every label, nodes, decision)",
    },
    Binding {
        scope: LIST,
        keys: &[(Char('b'), N)],
        label: "b",
        short: "bulk decide",
        action: KeyAction::Bulk,
        help: "bulk: one decision for every conflict shown (asks first)",
    },
    Binding {
        scope: LIST,
        keys: &[(Char('z'), N)],
        label: "z",
        short: "undo",
        action: KeyAction::Undo,
        help: "undo the last decision (a bulk decision as a whole)",
    },
    Binding {
        scope: LIST,
        keys: &[(Char('f'), N)],
        label: "f",
        short: "filter",
        action: KeyAction::CycleFilter,
        help: "filter by kind: all, conflicts, create, already migrated, invalid",
    },
    Binding {
        scope: LIST,
        keys: &[(Char('/'), N)],
        label: "/",
        short: "search",
        action: KeyAction::Search,
        help: "search labels and ids",
    },
    Binding {
        scope: LIST,
        keys: &[(Char('s'), N)],
        label: "s",
        short: "sort",
        action: KeyAction::CycleSort,
        help: "sort by the next column",
    },
    Binding {
        scope: LIST,
        keys: &[(Char('S'), S), (Char('S'), N)],
        label: "S",
        short: "reverse",
        action: KeyAction::ReverseSort,
        help: "reverse the sort",
    },
    Binding {
        scope: LIST,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "up",
        action: KeyAction::Up,
        help: "up",
    },
    Binding {
        scope: LIST,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "down",
        action: KeyAction::Down,
        help: "down",
    },
    Binding {
        scope: LIST,
        keys: &[(PageUp, N), (Char('b'), C)],
        label: "PgUp",
        short: "page up",
        action: KeyAction::PageUp,
        help: "page up",
    },
    Binding {
        scope: LIST,
        keys: &[(PageDown, N), (Char('f'), C)],
        label: "PgDn",
        short: "page down",
        action: KeyAction::PageDown,
        help: "page down",
    },
    Binding {
        scope: LIST,
        keys: &[(Home, N), (Char('g'), N)],
        label: "g",
        short: "top",
        action: KeyAction::Home,
        help: "first row",
    },
    Binding {
        scope: LIST,
        keys: &[(End, N), (Char('G'), S), (Char('G'), N)],
        label: "G",
        short: "bottom",
        action: KeyAction::End,
        help: "last row",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('n'), N), (Down, N), (Char('j'), N)],
        label: "n",
        short: "next",
        action: KeyAction::NextConflict,
        help: "next conflict",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('N'), S), (Char('N'), N), (Up, N), (Char('k'), N)],
        label: "N",
        short: "previous",
        action: KeyAction::PrevConflict,
        help: "previous conflict",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('a'), N)],
        label: "a",
        short: "accept",
        action: KeyAction::Accept,
        help: "accept the proposal",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('e'), N)],
        label: "e",
        short: "edit id",
        action: KeyAction::EditTarget,
        help: "edit the target id (checked: in range and free)",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('u'), N)],
        label: "u",
        short: "reuse",
        action: KeyAction::Reuse,
        help: "reuse the id that already has these labels",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('s'), N)],
        label: "s",
        short: "skip",
        action: KeyAction::Skip,
        help: "skip: write nothing for it",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('c'), N)],
        label: "c",
        short: "create anyway",
        action: KeyAction::CreateAnyway,
        help: "create anyway at its own id (duplicate)",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('z'), N)],
        label: "z",
        short: "undo",
        action: KeyAction::Undo,
        help: "undo the last decision",
    },
    Binding {
        scope: CONF,
        keys: &[(Char('A'), S), (Char('A'), N)],
        label: "A",
        short: "accept all",
        action: KeyAction::AcceptAll,
        help: "accept all remaining proposals (asks first)",
    },
    Binding {
        scope: COMMIT,
        keys: &[(Enter, N), (Char('c'), N)],
        label: "Enter",
        short: "commit",
        action: KeyAction::Commit,
        help: "commit: asks you to type yes",
    },
    Binding {
        scope: COMMIT,
        keys: &[(Char('r'), N)],
        label: "r",
        short: "retry/resume",
        action: KeyAction::Retry,
        help: "retry failed items, or resume a paused commit",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Enter, N), (Char('c'), N)],
        label: "Enter",
        short: "delete",
        action: KeyAction::Commit,
        help: "delete what is marked delete: asks you to type yes",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Char('I'), S), (Char('I'), N)],
        label: "I",
        short: "in use too",
        action: KeyAction::IncludeInUse,
        help: "mark identities live endpoints use for deletion too: asks you to type in use",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Char('c'), C)],
        label: "Ctrl-C",
        short: "stop+quit",
        action: KeyAction::Stop,
        help: "stop deleting, then quit: in-flight deletes finish",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Char('p'), N)],
        label: "p",
        short: "pause",
        action: KeyAction::Pause,
        help: "pause: stop deleting and stay; r resumes",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Char('r'), N)],
        label: "r",
        short: "retry/resume",
        action: KeyAction::Retry,
        help: "delete what is left after a pause or a failure",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "down",
        action: KeyAction::Down,
        help: "scroll down",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "up",
        action: KeyAction::Up,
        help: "scroll up",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(PageDown, N), (Char('f'), C)],
        label: "PgDn",
        short: "page down",
        action: KeyAction::PageDown,
        help: "page down",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(PageUp, N), (Char('b'), C)],
        label: "PgUp",
        short: "page up",
        action: KeyAction::PageUp,
        help: "page up",
    },
    Binding {
        scope: ROLLBACK,
        keys: &[(Char('R'), S), (Char('R'), N)],
        label: "R",
        short: "read again",
        action: KeyAction::Rescan,
        help: "read the logs' objects again and plan the rollback anew",
    },
    Binding {
        scope: COMMIT,
        keys: &[(Char('y'), N)],
        label: "y",
        short: "sync",
        action: KeyAction::StartSync,
        help: "start sync in place: follow both sides through the rollout",
    },
    Binding {
        scope: SYNC,
        keys: &[(Char('y'), N)],
        label: "y",
        short: "start",
        action: KeyAction::StartSync,
        help: "start sync: follow both sides, mirror new identities, report conflicts",
    },
    Binding {
        scope: SYNC,
        keys: &[(Char('c'), C)],
        label: "Ctrl-C",
        short: "stop+quit",
        action: KeyAction::Stop,
        help: "stop sync, then quit: writes in flight finish",
    },
    Binding {
        scope: SYNC,
        keys: &[(Enter, N)],
        label: "Enter",
        short: "whole report",
        action: KeyAction::Open,
        help: "the report at the bottom of the pane, whole",
    },
    Binding {
        scope: SYNC,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "older",
        action: KeyAction::Up,
        help: "scroll the reports back",
    },
    Binding {
        scope: SYNC,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "newer",
        action: KeyAction::Down,
        help: "scroll the reports forward",
    },
    Binding {
        scope: SYNC,
        keys: &[(PageUp, N)],
        label: "PgUp",
        short: "page back",
        action: KeyAction::PageUp,
        help: "a page of reports back",
    },
    Binding {
        scope: SYNC,
        keys: &[(PageDown, N)],
        label: "PgDn",
        short: "page on",
        action: KeyAction::PageDown,
        help: "a page of reports forward (to the newest)",
    },
    Binding {
        scope: PREFLIGHT,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "down",
        action: KeyAction::Down,
        help: "scroll the checks down",
    },
    Binding {
        scope: PREFLIGHT,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "up",
        action: KeyAction::Up,
        help: "scroll the checks up",
    },
    Binding {
        scope: PREFLIGHT,
        keys: &[(PageDown, N), (Char('f'), C)],
        label: "PgDn",
        short: "page down",
        action: KeyAction::PageDown,
        help: "a page of checks down",
    },
    Binding {
        scope: PREFLIGHT,
        keys: &[(PageUp, N), (Char('b'), C)],
        label: "PgUp",
        short: "page up",
        action: KeyAction::PageUp,
        help: "a page of checks up",
    },
    Binding {
        scope: CONF,
        keys: &[(PageDown, N), (Char('f'), C)],
        label: "PgDn",
        short: "labels down",
        action: KeyAction::PageDown,
        help: "scroll both label panes down (a label set longer than the panes)",
    },
    Binding {
        scope: CONF,
        keys: &[(PageUp, N), (Char('b'), C)],
        label: "PgUp",
        short: "labels up",
        action: KeyAction::PageUp,
        help: "scroll both label panes up",
    },
    Binding {
        scope: AUDIT,
        keys: &[(Char('R'), S), (Char('R'), N), (Enter, N)],
        label: "R",
        short: "audit again",
        action: KeyAction::Audit,
        help: "read both stores again and audit them",
    },
    Binding {
        scope: AUDIT,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "down",
        action: KeyAction::Down,
        help: "next finding",
    },
    Binding {
        scope: AUDIT,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "up",
        action: KeyAction::Up,
        help: "previous finding",
    },
    Binding {
        scope: AUDIT,
        keys: &[(PageDown, N)],
        label: "PgDn",
        short: "page down",
        action: KeyAction::PageDown,
        help: "page down",
    },
    Binding {
        scope: AUDIT,
        keys: &[(PageUp, N)],
        label: "PgUp",
        short: "page up",
        action: KeyAction::PageUp,
        help: "page up",
    },
    Binding {
        scope: SWITCH,
        keys: &[(Char('R'), S), (Char('R'), N)],
        label: "R",
        short: "read again",
        action: KeyAction::SwitchReport,
        help: "read pods, namespaces, identities and endpoints again",
    },
    Binding {
        scope: SWITCH,
        keys: &[(Char('n'), N)],
        label: "n",
        short: "next",
        action: KeyAction::NextConflict,
        help: "next pod the switch does not simply adopt (as in the conflict review)",
    },
    Binding {
        scope: SWITCH,
        keys: &[(Char('N'), S), (Char('N'), N)],
        label: "N",
        short: "previous",
        action: KeyAction::PrevConflict,
        help: "previous pod the switch does not simply adopt",
    },
    Binding {
        scope: SWITCH,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "down",
        action: KeyAction::Down,
        help: "next pod",
    },
    Binding {
        scope: SWITCH,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "up",
        action: KeyAction::Up,
        help: "previous pod",
    },
    Binding {
        scope: SWITCH,
        keys: &[(PageDown, N)],
        label: "PgDn",
        short: "page down",
        action: KeyAction::PageDown,
        help: "page down",
    },
    Binding {
        scope: SWITCH,
        keys: &[(PageUp, N)],
        label: "PgUp",
        short: "page up",
        action: KeyAction::PageUp,
        help: "page up",
    },
    Binding {
        scope: SWITCH,
        keys: &[(Home, N), (Char('g'), N)],
        label: "g",
        short: "top",
        action: KeyAction::Home,
        help: "first pod",
    },
    Binding {
        scope: SWITCH,
        keys: &[(End, N), (Char('G'), S), (Char('G'), N)],
        label: "G",
        short: "bottom",
        action: KeyAction::End,
        help: "last pod",
    },
    Binding {
        scope: FLEET,
        keys: &[(Enter, N)],
        label: "Enter",
        short: "open",
        action: KeyAction::Open,
        help: "open this cluster's screens (Esc comes back to the fleet)",
    },
    Binding {
        scope: FLEET,
        keys: &[(Char('n'), N)],
        label: "n",
        short: "next",
        action: KeyAction::NextConflict,
        help: "next cluster that needs attention",
    },
    Binding {
        scope: FLEET,
        keys: &[(Char('N'), S), (Char('N'), N)],
        label: "N",
        short: "previous",
        action: KeyAction::PrevConflict,
        help: "previous cluster that needs attention",
    },
    Binding {
        scope: FLEET,
        keys: &[(Char('/'), N)],
        label: "/",
        short: "filter",
        action: KeyAction::Search,
        help: "filter the clusters by name or by what they need (Enter keeps it, Esc clears it)",
    },
    Binding {
        scope: FLEET,
        keys: &[(Char('R'), S), (Char('R'), N)],
        label: "R",
        short: "read again",
        action: KeyAction::Rescan,
        help: "read every cluster again now (they are read again every 30 s)",
    },
    Binding {
        scope: FLEET,
        keys: &[(Down, N), (Char('j'), N)],
        label: "↓/j",
        short: "down",
        action: KeyAction::Down,
        help: "next cluster",
    },
    Binding {
        scope: FLEET,
        keys: &[(Up, N), (Char('k'), N)],
        label: "↑/k",
        short: "up",
        action: KeyAction::Up,
        help: "previous cluster",
    },
    Binding {
        scope: FLEET,
        keys: &[(PageDown, N)],
        label: "PgDn",
        short: "page down",
        action: KeyAction::PageDown,
        help: "page down",
    },
    Binding {
        scope: FLEET,
        keys: &[(PageUp, N)],
        label: "PgUp",
        short: "page up",
        action: KeyAction::PageUp,
        help: "page up",
    },
    Binding {
        scope: FLEET,
        keys: &[(Home, N), (Char('g'), N)],
        label: "g",
        short: "top",
        action: KeyAction::Home,
        help: "first cluster",
    },
    Binding {
        scope: FLEET,
        keys: &[(End, N), (Char('G'), S), (Char('G'), N)],
        label: "G",
        short: "bottom",
        action: KeyAction::End,
        help: "last cluster",
    },
];

fn scope_matches(scope: Scope, screen: Screen) -> bool {
    match scope {
        Scope::Global => true,
        Scope::On(s) => s == screen,
    }
}

/// Whether a global binding works on `screen`: a rollback is a screen of its own, with no
/// other screen to go to and no plan to export, so those keys do nothing there (and its help
/// does not list them); the Fleet screen, above every cluster's screens, takes only help and
/// quit of them.
fn global_works_on(b: &Binding, screen: Screen) -> bool {
    let elsewhere = matches!(
        b.action,
        KeyAction::Go(_) | KeyAction::NextScreen | KeyAction::Export
    );
    match screen {
        Screen::Rollback => !elsewhere,
        Screen::Fleet => matches!(b.action, KeyAction::Help | KeyAction::Quit),
        _ => true,
    }
}

/// The action bound to a key on a screen; screen bindings win over global ones.
pub fn action_for(screen: Screen, key: &KeyEvent) -> Option<KeyAction> {
    let hit = |b: &&Binding| {
        b.keys.iter().any(|(code, mods)| {
            *code == key.code
                && (*mods == key.modifiers || (*mods == S && key.modifiers.is_empty()))
        })
    };
    BINDINGS
        .iter()
        .filter(|b| b.scope != Scope::Global && scope_matches(b.scope, screen))
        .find(hit)
        .or_else(|| {
            BINDINGS
                .iter()
                .filter(|b| b.scope == Scope::Global && global_works_on(b, screen))
                .find(hit)
        })
        .map(|b| b.action)
}

/// The bindings that work on a screen, screen-specific first. A global binding whose keys
/// all the screen takes for its own (the Audit screen's `R`) is left out: it does not work there.
pub fn bindings_for(screen: Screen) -> impl Iterator<Item = &'static Binding> {
    let own = move || {
        BINDINGS
            .iter()
            .filter(move |b| b.scope == Scope::On(screen))
    };
    let shadowed = move |g: &Binding| g.keys.iter().all(|k| own().any(|b| b.keys.contains(k)));
    own().chain(
        BINDINGS.iter().filter(move |b| {
            b.scope == Scope::Global && !shadowed(b) && global_works_on(b, screen)
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screen_bindings_win_and_every_action_has_help() {
        let k = |c| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(
            action_for(Screen::Conflicts, &k(Char('s'))),
            Some(KeyAction::Skip)
        );
        assert_eq!(
            action_for(Screen::Identities, &k(Char('s'))),
            Some(KeyAction::CycleSort)
        );
        assert_eq!(
            action_for(Screen::Identities, &k(Char('q'))),
            Some(KeyAction::Quit)
        );
        assert_eq!(
            action_for(
                Screen::Commit,
                &KeyEvent::new(Char('c'), KeyModifiers::CONTROL)
            ),
            Some(KeyAction::Stop)
        );
        assert_eq!(
            action_for(
                Screen::Identities,
                &KeyEvent::new(Char('c'), KeyModifiers::CONTROL)
            ),
            Some(KeyAction::Quit)
        );
        assert_eq!(
            action_for(
                Screen::Identities,
                &KeyEvent::new(Char('G'), KeyModifiers::SHIFT)
            ),
            Some(KeyAction::End)
        );
        assert!(
            BINDINGS
                .iter()
                .all(|b| !b.help.is_empty() && !b.short.is_empty() && !b.keys.is_empty())
        );
    }

    #[test]
    fn a_rollback_lists_and_takes_no_key_of_the_other_screens() {
        let labels: Vec<&str> = bindings_for(Screen::Rollback).map(|b| b.label).collect();
        for gone in ["1", "7", "Tab", "x"] {
            assert!(!labels.contains(&gone), "{gone} in {labels:?}");
        }
        let k = |c| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(action_for(Screen::Rollback, &k(Char('x'))), None);
        assert_eq!(action_for(Screen::Rollback, &k(Tab)), None);
        assert_eq!(
            action_for(Screen::Rollback, &k(Char('q'))),
            Some(KeyAction::Quit)
        );
        let r = bindings_for(Screen::Rollback)
            .find(|b| b.label == "R")
            .unwrap();
        assert!(r.help.contains("rollback"), "{}", r.help);
    }

    #[test]
    fn each_screen_lists_a_key_once_the_one_that_works_there() {
        for screen in Screen::ALL.into_iter().chain(Screen::ROLLBACK) {
            let labels: Vec<&str> = bindings_for(screen).map(|b| b.label).collect();
            let mut unique = labels.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(labels.len(), unique.len(), "{screen:?}: {labels:?}");
            // Whatever is listed is what the key does there.
            for b in bindings_for(screen) {
                let (code, mods) = b.keys[0];
                let mods = if mods == S { KeyModifiers::NONE } else { mods };
                assert_eq!(
                    action_for(screen, &KeyEvent::new(code, mods)),
                    Some(b.action),
                    "{screen:?} {}",
                    b.label
                );
            }
        }
    }
}

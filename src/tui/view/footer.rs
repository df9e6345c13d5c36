//! The footer's key hints: those of a screen that fit the width, most important first.

use crate::tui::keys::bindings_for;
use crate::tui::model::Screen;

/// The key hints that fit in `width` columns, most important first (the screen's own keys,
/// then the global ones, in key-table order), leaving room for the closing `? more` (or
/// `? help`); `true` when some had to be left out. `offered` leaves out keys that do
/// nothing now.
pub fn footer_hints(
    screen: Screen,
    width: u16,
    offered: impl Fn(crate::tui::keys::KeyAction) -> bool,
) -> (Vec<(&'static str, &'static str)>, bool) {
    let cell = |label: &str, text: &str| label.chars().count() + text.chars().count() + 3;
    let room = usize::from(width).saturating_sub(cell("?", "more"));
    let mut used = 0;
    let mut hints = Vec::new();
    let mut cut = false;
    for b in bindings_for(screen) {
        if matches!(b.label, "1" | "2" | "3" | "4" | "5" | "6" | "?") || !offered(b.action) {
            continue;
        }
        let text = b.short;
        let w = cell(b.label, text);
        if cut || used + w > room {
            cut = true;
            continue;
        }
        used += w;
        hints.push((b.label, text));
    }
    (hints, cut)
}

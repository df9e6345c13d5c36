//! The guide's key reference, written from the TUI's key table (`tui::keys::BINDINGS`), the
//! same table that dispatches keys and draws the footer and the `?` help.

use crate::tui::keys::{BINDINGS, Binding, Scope};
use crate::tui::model::Screen;

fn table(out: &mut String, bindings: impl Iterator<Item = &'static Binding>) {
    let mut bindings = bindings.peekable();
    if bindings.peek().is_none() {
        out.push_str("Only the keys of every screen.\n");
        return;
    }
    out.push_str("| key | what it does |\n|---|---|\n");
    for b in bindings {
        let label = b.label.replace('|', "\\|");
        out.push_str(&format!("| `{label}` | {} |\n", b.help.replace('|', "\\|")));
    }
}

/// The Markdown page: the keys of every screen, then each screen's own.
pub fn reference() -> String {
    let mut out = String::from(
        "# Keys\n\n<!-- Written from src/tui/keys.rs by `UPDATE_SNAPSHOTS=1 cargo test generated_docs`; a test fails when they differ. -->\n\n\
         Every key of the TUI, from the table that handles them. `?` shows the same list for the\n\
         screen you are on; the footer shows the most important ones that fit.\n\n## On every screen\n\n",
    );
    table(
        &mut out,
        BINDINGS.iter().filter(|b| b.scope == Scope::Global),
    );
    for screen in Screen::ALL.into_iter().chain(Screen::ROLLBACK) {
        out.push_str(&format!("\n## {}\n\n", screen.title()));
        table(
            &mut out,
            BINDINGS
                .iter()
                .filter(move |b| b.scope == Scope::On(screen)),
        );
    }
    out
}

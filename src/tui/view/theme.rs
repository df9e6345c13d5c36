//! The look shared by every screen: colours (or none, under `NO_COLOR`), the symbol of each
//! kind, and centring a popup.

use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use crate::core::planner::Kind;
use crate::tui::model::Model;

/// Styles that still read without colour (`NO_COLOR`): colour is only ever a second cue.
pub struct Theme {
    no_color: bool,
}

impl Theme {
    pub fn of(model: &Model) -> Self {
        Theme::plain(model.no_color)
    }
    /// The theme of a screen drawn without a cluster's model (the Fleet screen).
    pub fn plain(no_color: bool) -> Self {
        Theme { no_color }
    }
    pub fn fg(&self, c: Color) -> Style {
        if self.no_color {
            Style::default()
        } else {
            Style::default().fg(c)
        }
    }
    pub fn kind(&self, kind: Kind) -> Style {
        match kind {
            Kind::AlreadyMigrated => self.fg(Color::DarkGray),
            Kind::Create => Style::default(),
            Kind::Remap => self.fg(Color::Yellow).add_modifier(Modifier::BOLD),
            Kind::Reuse => self.fg(Color::Cyan).add_modifier(Modifier::BOLD),
            Kind::Duplicate => self.fg(Color::Magenta).add_modifier(Modifier::BOLD),
            Kind::Invalid => self.fg(Color::Red),
            // A rollback's lines of switch-prepare: they serve pods, no plan shows them.
            Kind::SwitchCreate | Kind::SwitchRemoveDuplicate | Kind::SwitchRemoveUnused => {
                Style::default()
            }
        }
    }
    pub fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }
    pub fn bad(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }
    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow)
    }
    pub fn good(&self) -> Style {
        self.fg(Color::Green)
    }
    pub fn dim(&self) -> Style {
        if self.no_color {
            Style::default()
        } else {
            Style::default().fg(Color::DarkGray)
        }
    }
}

/// A symbol per kind, so conflicts stand out without colour too.
pub fn symbol(kind: Kind) -> &'static str {
    match kind {
        Kind::AlreadyMigrated => "=",
        Kind::Create => "+",
        Kind::Remap => "~",
        Kind::Reuse => ">",
        Kind::Duplicate => "!",
        Kind::Invalid => "x",
        Kind::SwitchCreate | Kind::SwitchRemoveDuplicate | Kind::SwitchRemoveUnused => "s",
    }
}

/// A rectangle of at most `w` x `h` centred in `area`.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

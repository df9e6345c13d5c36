//! A terminal buffer drawn as SVG: each cell's symbol, colours and weight kept, so the
//! guide shows what the TUI draws, not a description of it.

use std::fmt::Write;

use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

/// A cell's width and height in pixels at the font size below: a monospace font's advance is
/// about 0.6 of its size, and a terminal line about 1.2.
const CELL_W: f64 = 8.4;
const CELL_H: f64 = 17.0;
const FONT_SIZE: u32 = 14;
const BACKGROUND: &str = "#1e1e1e";
const FOREGROUND: &str = "#d4d4d4";

/// The colours of a common dark terminal theme (VS Code's), by ratatui's names.
fn rgb(c: Color, default: &'static str) -> String {
    let named = match c {
        Color::Reset => default,
        Color::Black => "#000000",
        Color::Red => "#cd3131",
        Color::Green => "#0dbc79",
        Color::Yellow => "#e5e510",
        Color::Blue => "#2472c8",
        Color::Magenta => "#bc3fbc",
        Color::Cyan => "#11a8cd",
        Color::Gray => "#e5e5e5",
        Color::DarkGray => "#767676",
        Color::LightRed => "#f14c4c",
        Color::LightGreen => "#23d18b",
        Color::LightYellow => "#f5f543",
        Color::LightBlue => "#3b8eea",
        Color::LightMagenta => "#d670d6",
        Color::LightCyan => "#29b8db",
        Color::White => "#ffffff",
        Color::Rgb(r, g, b) => return format!("#{r:02x}{g:02x}{b:02x}"),
        // The 256-colour cube and greys, as xterm defines them.
        Color::Indexed(i) => return indexed(i),
    };
    named.to_string()
}

fn indexed(i: u8) -> String {
    match i {
        0..=15 => rgb(
            [
                Color::Black,
                Color::Red,
                Color::Green,
                Color::Yellow,
                Color::Blue,
                Color::Magenta,
                Color::Cyan,
                Color::Gray,
                Color::DarkGray,
                Color::LightRed,
                Color::LightGreen,
                Color::LightYellow,
                Color::LightBlue,
                Color::LightMagenta,
                Color::LightCyan,
                Color::White,
            ][i as usize],
            FOREGROUND,
        ),
        16..=231 => {
            let level = |v: u8| if v == 0 { 0 } else { 55 + v * 40 };
            let n = i - 16;
            format!(
                "#{:02x}{:02x}{:02x}",
                level(n / 36),
                level(n / 6 % 6),
                level(n % 6)
            )
        }
        _ => {
            let v = 8 + (i - 232) * 10;
            format!("#{v:02x}{v:02x}{v:02x}")
        }
    }
}

/// How one cell is drawn: foreground, background, bold.
#[derive(PartialEq, Clone)]
struct Look {
    fg: String,
    bg: String,
    bold: bool,
}

fn look(cell: &ratatui::buffer::Cell) -> Look {
    let (mut fg, mut bg) = (rgb(cell.fg, FOREGROUND), rgb(cell.bg, BACKGROUND));
    if cell.modifier.contains(Modifier::REVERSED) {
        std::mem::swap(&mut fg, &mut bg);
    }
    if cell.modifier.contains(Modifier::DIM) {
        fg = rgb(Color::DarkGray, FOREGROUND);
    }
    Look {
        fg,
        bg,
        bold: cell.modifier.contains(Modifier::BOLD),
    }
}

/// A length in pixels, to a tenth: short, and the same on every machine.
fn px(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The buffer as a standalone SVG document. Runs of cells that look alike become one text
/// element stretched to their cells' width, so columns line up whatever the viewer's font.
pub fn to_svg(buf: &Buffer, title: &str) -> String {
    let (w, h) = (buf.area.width, buf.area.height);
    let (pw, ph) = (px(f64::from(w) * CELL_W), px(f64::from(h) * CELL_H));
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{pw}" height="{ph}" viewBox="0 0 {pw} {ph}" role="img" aria-label="{}">"#,
        escape(title)
    );
    let _ = writeln!(out, "<title>{}</title>", escape(title));
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="{BACKGROUND}"/>"#
    );
    let _ = writeln!(
        out,
        r#"<g font-family="'DejaVu Sans Mono', Menlo, Consolas, monospace" font-size="{FONT_SIZE}" xml:space="preserve">"#
    );
    for y in 0..h {
        let mut x = 0;
        while x < w {
            let first = look(&buf[(x, y)]);
            let mut text = String::new();
            let start = x;
            while x < w && look(&buf[(x, y)]) == first {
                text.push_str(buf[(x, y)].symbol());
                x += 1;
            }
            let (left, top) = (f64::from(start) * CELL_W, f64::from(y) * CELL_H);
            let width = f64::from(x - start) * CELL_W;
            if first.bg != BACKGROUND {
                let _ = writeln!(
                    out,
                    r#"<rect x="{}" y="{}" width="{}" height="{CELL_H}" fill="{}"/>"#,
                    px(left),
                    px(top),
                    px(width),
                    first.bg
                );
            }
            let shown = text.trim_end();
            if shown.trim().is_empty() {
                continue;
            }
            let cells = shown.chars().count() as f64;
            let weight = if first.bold {
                r#" font-weight="bold""#
            } else {
                ""
            };
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" fill="{}"{weight} textLength="{}" lengthAdjust="spacingAndGlyphs">{}</text>"#,
                px(left),
                px(top + CELL_H * 0.78),
                first.fg,
                px(cells * CELL_W),
                escape(shown)
            );
        }
    }
    out.push_str("</g>\n</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::Style;

    #[test]
    fn cells_keep_their_text_colour_and_weight() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 12, 2));
        buf.set_string(0, 0, "ok <x>", Style::default().fg(Color::Green));
        buf.set_string(
            7,
            0,
            "bad",
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        );
        buf.set_string(
            0,
            1,
            "sel",
            Style::default().add_modifier(Modifier::REVERSED),
        );
        let svg = to_svg(&buf, "a & b");
        assert!(svg.contains(r##"fill="#0dbc79" textLength="50.4" lengthAdjust="spacingAndGlyphs">ok &lt;x&gt;</text>"##), "{svg}");
        assert!(
            svg.contains(r##"fill="#cd3131" font-weight="bold""##),
            "{svg}"
        );
        // Reversed: the default colours swapped, the background a rectangle of its own.
        assert!(
            svg.contains(r##"y="17" width="25.2" height="17" fill="#d4d4d4"/>"##),
            "{svg}"
        );
        assert!(
            svg.contains(r##"fill="#1e1e1e" textLength="25.2""##),
            "{svg}"
        );
        assert!(svg.contains("<title>a &amp; b</title>"), "{svg}");
        assert_eq!(indexed(196), "#ff0000");
        assert_eq!(indexed(244), "#808080");
    }
}

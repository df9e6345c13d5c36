//! A one-line text field that edits like a shell prompt: a cursor, Left/Right, Home/End
//! (and Ctrl-A/Ctrl-E), Backspace/Delete, Ctrl-U (to the start), Ctrl-K (to the end),
//! Ctrl-W (the word before the cursor).

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextField {
    text: String,
    /// Byte offset of the cursor, always on a character boundary.
    cursor: usize,
}

impl TextField {
    /// A field holding `text`, with the cursor at its end.
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        TextField {
            cursor: text.len(),
            text,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The text before and after the cursor, for drawing it.
    pub fn split(&self) -> (&str, &str) {
        self.text.split_at(self.cursor)
    }

    fn prev_boundary(&self, from: usize) -> usize {
        self.text[..from]
            .char_indices()
            .next_back()
            .map_or(0, |(i, _)| i)
    }

    fn next_boundary(&self, from: usize) -> usize {
        self.text[from..]
            .chars()
            .next()
            .map_or(from, |c| from + c.len_utf8())
    }

    /// Applies an editing key; `accept` says which characters may be typed. Returns whether
    /// the key was an editing key (typed characters that `accept` refuses count as handled).
    pub fn on_key(&mut self, key: &KeyEvent, accept: impl Fn(char) -> bool) -> bool {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        match key.code {
            KeyCode::Char('a') if ctrl => self.cursor = 0,
            KeyCode::Char('e') if ctrl => self.cursor = self.text.len(),
            KeyCode::Char('u') if ctrl => {
                self.text.drain(..self.cursor);
                self.cursor = 0;
            }
            KeyCode::Char('k') if ctrl => self.text.truncate(self.cursor),
            KeyCode::Char('w') if ctrl => {
                let before = &self.text[..self.cursor];
                let trimmed = before.trim_end_matches(' ');
                let start = trimmed.rfind(' ').map_or(0, |i| i + 1);
                self.text.drain(start..self.cursor);
                self.cursor = start;
            }
            KeyCode::Char(_) if ctrl => return false,
            KeyCode::Char(c) => {
                if accept(c) {
                    self.text.insert(self.cursor, c);
                    self.cursor += c.len_utf8();
                }
            }
            KeyCode::Backspace => {
                if self.cursor > 0 {
                    let start = self.prev_boundary(self.cursor);
                    self.text.drain(start..self.cursor);
                    self.cursor = start;
                }
            }
            KeyCode::Delete => {
                let end = self.next_boundary(self.cursor);
                self.text.drain(self.cursor..end);
            }
            KeyCode::Left => self.cursor = self.prev_boundary(self.cursor),
            KeyCode::Right => self.cursor = self.next_boundary(self.cursor),
            KeyCode::Home => self.cursor = 0,
            KeyCode::End => self.cursor = self.text.len(),
            _ => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn ctrl(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
    }

    fn typed(f: &mut TextField, s: &str) {
        for c in s.chars() {
            f.on_key(&key(KeyCode::Char(c)), |_| true);
        }
    }

    #[test]
    fn edits_like_a_shell_line() {
        let mut f = TextField::default();
        typed(&mut f, "app=web shop");
        f.on_key(&ctrl('w'), |_| true);
        assert_eq!(f.text(), "app=web ");
        f.on_key(&key(KeyCode::Home), |_| true);
        typed(&mut f, "k8s:");
        assert_eq!(f.split(), ("k8s:", "app=web "));
        f.on_key(&key(KeyCode::End), |_| true);
        f.on_key(&key(KeyCode::Left), |_| true);
        f.on_key(&key(KeyCode::Backspace), |_| true);
        assert_eq!(f.text(), "k8s:app=we ");
        f.on_key(&key(KeyCode::Delete), |_| true);
        assert_eq!(f.text(), "k8s:app=we");
        f.on_key(&ctrl('a'), |_| true);
        f.on_key(&key(KeyCode::Right), |_| true);
        f.on_key(&ctrl('k'), |_| true);
        assert_eq!(f.text(), "k");
        typed(&mut f, "é8");
        f.on_key(&key(KeyCode::Left), |_| true);
        f.on_key(&key(KeyCode::Left), |_| true);
        assert_eq!(f.split(), ("k", "é8"));
        f.on_key(&ctrl('e'), |_| true);
        f.on_key(&ctrl('u'), |_| true);
        assert!(f.is_empty());
        // Refused characters are handled (not passed on) but not typed.
        assert!(f.on_key(&key(KeyCode::Char('x')), |c| c.is_ascii_digit()));
        assert!(f.is_empty());
        assert!(!f.on_key(&key(KeyCode::Enter), |_| true));
    }
}

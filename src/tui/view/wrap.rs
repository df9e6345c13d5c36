//! Word wrapping that the views measure before they draw: a check's continuation lines
//! indented under its text, a report list that shows its newest lines whole.

/// Splits `text` into lines of at most `width` columns at spaces (a longer word is cut).
pub fn words(text: &str, width: usize) -> Vec<String> {
    let width = width.max(10);
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let mut word = word.to_string();
        loop {
            let used = line.chars().count();
            let need = word.chars().count() + usize::from(used > 0);
            if used + need <= width {
                if used > 0 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if used > 0 {
                out.push(std::mem::take(&mut line));
                continue;
            }
            // A word longer than a line.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            out.push(head);
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || out.is_empty() {
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn hanging_lines_fit_and_keep_every_word() {
        let text = "RBAC: create ciliumidentities.cilium.io: denied because the service account has no binding";
        for width in [30, 45, 80] {
            let lines = super::words(text, width);
            assert!(
                lines.iter().all(|l| l.chars().count() <= width.max(10)),
                "{width}: {lines:?}"
            );
            assert_eq!(lines.join(" "), text, "{width}");
        }
        assert_eq!(super::words("", 20), vec![String::new()]);
        // A word longer than the line is cut, never lost.
        assert_eq!(super::words("abcdefghijkl", 10), vec!["abcdefghij", "kl"]);
    }
}

//! How counts read in what the tool prints: "1 pending decision", "2 pending decisions".

/// `n` and `noun`, the noun in the plural unless `n` is 1 (nouns that take an `s`).
pub fn count<N: std::fmt::Display + PartialEq + From<u8>>(n: N, noun: &str) -> String {
    if n == N::from(1) {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::count(1u32, "problem"), "1 problem");
        assert_eq!(super::count(0u32, "problem"), "0 problems");
        assert_eq!(
            super::count(2usize, "kvstore-mode node"),
            "2 kvstore-mode nodes"
        );
    }
}

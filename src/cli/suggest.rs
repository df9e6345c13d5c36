//! "Did you mean": clap suggests a flag only when it is close by its own measure, which
//! misses the commonest typo, two letters swapped (`--yse`). This adds a tip for flags one
//! edit away, counting a swap of neighbours as one edit, among the flags of the subcommand
//! that was typed.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The flag `err` reports as unknown and a long flag of `cmd` one edit from it, if clap
/// itself suggested nothing.
pub fn did_you_mean(cmd: &clap::Command, err: &clap::Error, args: &[String]) -> Option<String> {
    if err.kind() != ErrorKind::UnknownArgument || err.get(ContextKind::SuggestedArg).is_some() {
        return None;
    }
    let Some(ContextValue::String(bad)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let typed = bad.strip_prefix("--")?.split('=').next()?;
    // The deepest subcommand named on the line is the one whose flags count.
    let mut scope = cmd;
    for a in args.iter().skip(1) {
        if let Some(sub) = scope.find_subcommand(a) {
            scope = sub;
        }
    }
    scope
        .get_arguments()
        .chain(cmd.get_arguments().filter(|a| a.is_global_set()))
        .filter_map(|a| a.get_long())
        .find(|long| *long != typed && edits(typed, long) == 1)
        .map(|long| format!("--{long}"))
}

/// The tip for flags typed before the command (`cilium-idmig --log-level debug plan`): each
/// command takes its own flags after its name, and clap only says they conflict.
pub fn flags_after_command(err: &clap::Error) -> Option<String> {
    if err.kind() != ErrorKind::ArgumentConflict {
        return None;
    }
    let Some(ContextValue::String(sub)) = err.get(ContextKind::InvalidSubcommand) else {
        return None;
    };
    Some(format!(
        "a command's flags go after its name: cilium-idmig {sub} [FLAGS]"
    ))
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// neighbours each count one.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_swap_or_one_letter_off_is_one_edit() {
        assert_eq!(edits("yse", "yes"), 1);
        assert_eq!(edits("ye", "yes"), 1);
        assert_eq!(edits("yess", "yes"), 1);
        assert_eq!(edits("plan", "yes"), 4);
    }

    #[test]
    fn the_typed_subcommands_flag_is_suggested() {
        let cmd = crate::cli::args::Cli::command();
        let args: Vec<String> = ["cilium-idmig", "apply", "--yse"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let err = cmd.clone().try_get_matches_from(&args).unwrap_err();
        assert_eq!(did_you_mean(&cmd, &err, &args).as_deref(), Some("--yes"));
        let args: Vec<String> = ["cilium-idmig", "apply", "--zzzzz"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let err = cmd.clone().try_get_matches_from(&args).unwrap_err();
        assert_eq!(did_you_mean(&cmd, &err, &args), None);
    }

    #[test]
    fn flags_before_the_command_get_the_tip_to_move_them() {
        let cmd = crate::cli::args::Cli::command();
        let err = cmd
            .clone()
            .try_get_matches_from(["cilium-idmig", "--log-level", "debug", "plan"])
            .unwrap_err();
        let tip = flags_after_command(&err).unwrap_or_default();
        assert!(tip.contains("cilium-idmig plan [FLAGS]"), "{tip}");
        let err = cmd
            .try_get_matches_from(["cilium-idmig", "plan", "--yse"])
            .unwrap_err();
        assert_eq!(flags_after_command(&err), None);
    }
}

//! The commands that reach no cluster: `log` (the decision logs as they are, their
//! decisions alone, or held for `kubectl exec`), `completions` and `man`.

use super::*;
use clap::CommandFactory;

/// `log`: the logs as they are, the decisions alone, or held for `kubectl exec`.
pub(super) async fn log(
    files: Vec<PathBuf>,
    decisions_only: bool,
    hold: bool,
) -> anyhow::Result<Exit> {
    use std::io::Write as _;
    // Each log read once, and checked the one way every command reads a log: a damaged line
    // is an error.
    let mut logs = Vec::new();
    for f in &files {
        let bytes = decision_log::read_bytes(f)?;
        let contents = decision_log::parse(f, &bytes)?;
        if contents.torn_tail {
            eprintln!(
                "{}",
                cilium_idmig::core::decision_log::torn_left_out(&f.display().to_string())
            );
        }
        logs.push((bytes, contents));
    }
    if hold {
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        eprintln!(
            "holding {} for `kubectl exec POD -- cilium-idmig log FILE`; delete the pod when done",
            names.join(", ")
        );
        cilium_idmig::app::signals::StopSignals::new()?.recv().await;
        return Ok(Exit::Ok);
    }
    let mut stdout = std::io::stdout().lock();
    if decisions_only {
        let contents: Vec<_> = logs.into_iter().map(|(_, c)| c).collect();
        let compact = cilium_idmig::app::export::decisions_only(&contents)?;
        stdout
            .write_all(&compact)
            .map_err(super::super::out::StdoutError)?;
        if compact.len() > CONFIGMAP_BYTES {
            eprintln!(
                "warning: the decisions take {} bytes, more than a ConfigMap holds (1 MiB): give sync the file on its volume with --resume instead",
                compact.len()
            );
        }
        return Ok(Exit::Ok);
    }
    for (bytes, _) in &logs {
        // Whole lines only: a sync may be appending to it right now.
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        // A reader that closed the pipe (`| head -1`) has what it wanted: a quiet exit 0.
        stdout
            .write_all(&bytes[..whole])
            .map_err(super::super::out::StdoutError)?;
    }
    Ok(Exit::Ok)
}

/// What a ConfigMap holds at most (its data and metadata together).
const CONFIGMAP_BYTES: usize = 1024 * 1024;

/// `completions SHELL`: the script for the file the shell runs.
pub(super) fn completions(shell: clap_complete::Shell) -> anyhow::Result<Exit> {
    // Completions are for the file the shell runs: `cilium-idmig`, or the plugin's
    // `kubectl-cilium_idmig`.
    let file = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "cilium-idmig".into());
    let mut cmd = super::super::args::Cli::command();
    // Into a buffer first: `generate` panics when its writer fails (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, file, &mut script);
    out!("{}", String::from_utf8_lossy(&script)).context("writing the completions")?;
    Ok(Exit::Ok)
}

/// `man [COMMAND]`: the tool's manual page, or one command's (`cilium-idmig-COMMAND(1)`,
/// the pages the main one's SUBCOMMANDS section names), in roff.
pub(super) fn man(command: Option<String>) -> anyhow::Result<Exit> {
    let cmd = super::super::args::Cli::command();
    let page_of = match &command {
        None => cmd,
        Some(name) => {
            let Some(sub) = cmd.find_subcommand(name) else {
                let names: Vec<String> = cmd
                    .get_subcommands()
                    .map(|c| c.get_name().to_string())
                    .filter(|n| n != "help")
                    .collect();
                return Err(cilium_idmig::Error::Config(format!(
                    "no command {name:?}: man prints the page of one of {}",
                    names.join(", ")
                ))
                .into());
            };
            // Named as the main page's SUBCOMMANDS section names it.
            let page = format!("cilium-idmig-{name}");
            sub.clone()
                .name(page.clone())
                .bin_name(format!("cilium-idmig {name}"))
        }
    };
    let page = man_page(page_of).context("rendering the manual page")?;
    out!("{}", String::from_utf8_lossy(&page)).context("writing the manual page")?;
    Ok(Exit::Ok)
}

/// A page as clap_mangen renders it, but for the end: the long help's examples and exit
/// status become the EXAMPLES and EXIT STATUS sections man pages have, not one EXTRA.
fn man_page(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    let after = cmd
        .get_after_long_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    let has_options = cmd.get_arguments().any(|a| !a.is_hide_set());
    let has_commands = cmd.has_subcommands();
    let has_version = cmd.get_version().is_some() || cmd.get_long_version().is_some();
    let man = clap_mangen::Man::new(cmd);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if has_options {
        man.render_options_section(&mut page)?;
    }
    if has_commands {
        man.render_subcommands_section(&mut page)?;
    }
    for part in after.split("\n\n") {
        let Some((heading, body)) = part.split_once('\n') else {
            continue;
        };
        let heading = match heading.trim_end_matches(':') {
            h if h.starts_with("Exit status") => "EXIT STATUS",
            "Examples" => "EXAMPLES",
            _ => continue,
        };
        page.extend_from_slice(format!(".SH \"{heading}\"\n.nf\n").as_bytes());
        for line in body.lines() {
            page.extend_from_slice(roff_line(line).as_bytes());
            page.push(b'\n');
        }
        page.extend_from_slice(b".fi\n");
    }
    if has_version {
        man.render_version_section(&mut page)?;
    }
    Ok(page)
}

/// A line of literal text in roff: backslashes and hyphens escaped, and a leading `.` or
/// `'` kept from reading as a request.
fn roff_line(line: &str) -> String {
    let text = line.replace('\\', "\\e").replace('-', "\\-");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

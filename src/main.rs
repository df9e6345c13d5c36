//! The `cilium-idmig` binary: parses the command line, runs the command, and maps the result
//! to the exit-code contract (0 ok, 1 failed work, 2 usage or configuration).

mod cli;

use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};

use cli::args::{Cli, CliCommand, Logging};
use cli::commands::{self, Exit};

/// Installed as `kubectl-cilium_idmig` on the PATH, the binary is a kubectl plugin
/// (`kubectl cilium-idmig ...`); its help and errors then say so.
fn invoked_name() -> &'static str {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let file = std::path::Path::new(&argv0)
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    if file.starts_with("kubectl-") {
        "kubectl cilium-idmig"
    } else {
        "cilium-idmig"
    }
}

fn main() -> ExitCode {
    let name = invoked_name();
    let command = Cli::command().bin_name(name);
    let matches = match command.clone().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let args: Vec<String> = std::env::args().collect();
            if let Some(flag) = cli::suggest::did_you_mean(&command, &e, &args) {
                let _ = e.print();
                eprintln!("\n  tip: did you mean '{flag}'?");
                return ExitCode::from(2);
            }
            if let Some(tip) = cli::suggest::flags_after_command(&e) {
                let _ = e.print();
                eprintln!("\n  tip: {tip}");
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    let command = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli.into_command(),
        Err(e) => e.exit(),
    };
    if let Some(op) = command.operator() {
        cilium_idmig::io::operator::set_explicit(op);
    }
    let interactive = match &command {
        CliCommand::Tui(_) => true,
        CliCommand::Demo(args) => !args.headless,
        _ => false,
    };
    if !interactive {
        // As kubectl does: each distinct warning of the API server once, on stderr.
        cilium_idmig::io::k8s::print_warnings_on_stderr();
    }
    let _guard = match command.logging().map(|log| init_logging(log, interactive)) {
        None => None,
        Some(Ok(g)) => g,
        Some(Err(e)) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    // A headless command runs on one thread. On a multi-threaded runtime the command's own
    // future runs on this thread while the workers drive its connections, so every frame of
    // a list crossed threads: a plan of 62,280 identities made 200,000 context switches and
    // spent 2 s in the kernel waking threads, as much as all its parsing; on one thread it
    // makes 15,000 and spends 0.4 s. The TUI keeps its workers: planning 65,280 identities
    // must not hold up the screen.
    let runtime = if interactive {
        tokio::runtime::Runtime::new()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(commands::run(command, name)) {
        Ok(Exit::Ok) => ExitCode::SUCCESS,
        Ok(Exit::Failed) => ExitCode::from(1),
        Ok(Exit::Refused) => ExitCode::from(2),
        // Output to a closed pipe (`... | head -1`): the reader has what it wanted.
        Err(e) if cli::out::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<cilium_idmig::Error>() {
            Some(le) => {
                // The library's messages already quote their cause: one line, no chain.
                tracing::debug!(error = ?le, "command failed");
                eprintln!("error: {le}");
                let usage = le.is_usage() || cilium_idmig::io::refusal::refused_by_server(le);
                ExitCode::from(if usage { 2 } else { 1 })
            }
            None => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn init_logging(
    log: &Logging,
    interactive: bool,
) -> anyhow::Result<Option<tracing_appender::non_blocking::WorkerGuard>> {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.log_level)
        .with_context(|| format!("--log-level {:?}", log.log_level))?;
    match &log.log_file {
        Some(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let name = path.file_name().context("--log-file needs a file name")?;
            let appender = tracing_appender::rolling::never(dir, name);
            let (writer, guard) = tracing_appender::non_blocking(appender);
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(writer)
                .init();
            Ok(Some(guard))
        }
        // While the TUI owns the screen nothing may print to it: no log file, no logs.
        None if interactive => Ok(None),
        None => {
            // On the terminal, only this tool's own warnings: errors reach the operator as one
            // clear line, not as the client library's log.
            let filter =
                tracing_subscriber::EnvFilter::try_new("cilium_idmig=warn").unwrap_or(filter);
            // Colour only on a terminal, and not when NO_COLOR asks for none.
            let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(colour)
                .with_writer(std::io::stderr)
                .init();
            Ok(None)
        }
    }
}

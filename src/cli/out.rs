//! Printing the headless commands' results: a write to a closed pipe (`... | head -1`)
//! becomes an error that `main` ends quietly with status 0, as other command-line tools do,
//! instead of `println!`'s panic.

use std::io::{self, Write};

/// A failed write to stdout. Its own type, so that only a closed stdout ends a command
/// quietly: a broken pipe to etcd or the API server is a failure like any other.
#[derive(Debug, thiserror::Error)]
#[error("writing to stdout: {0}")]
pub struct StdoutError(#[source] pub io::Error);

/// Writes to stdout; the error is the pipe's, for `?`.
pub fn write(args: std::fmt::Arguments<'_>) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// Writes `value` to stdout as pretty JSON and a newline, as it serializes: a report of tens
/// of thousands of entries never sits in memory twice, once as data and once as text.
pub fn json(value: &impl serde::Serialize) -> Result<(), StdoutError> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    serde_json::to_writer_pretty(&mut out, value)
        .map_err(io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// Whether an error is a write to a closed stdout.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<StdoutError>()
            .is_some_and(|s| s.0.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// `print!` that returns the write's error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::out::write(format_args!($($arg)*)) };
}

/// `println!` that returns the write's error instead of panicking.
macro_rules! outln {
    () => { $crate::cli::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_stdout_is_quiet_never_a_servers_broken_pipe() {
        let pipe = || io::Error::new(io::ErrorKind::BrokenPipe, "Broken pipe");
        let stdout = anyhow::Error::new(StdoutError(pipe())).context("writing the manual page");
        assert!(is_broken_pipe(&stdout));
        // etcd killed mid-request: the transport's broken pipe is a failure (exit 2), not
        // a reader that has had enough.
        let etcd = anyhow::Error::new(cilium_idmig::Error::etcd("http://e:2379", "range", pipe()));
        assert!(!is_broken_pipe(&etcd));
        let full = anyhow::Error::new(StdoutError(io::Error::other("disk full")));
        assert!(!is_broken_pipe(&full));
    }
}

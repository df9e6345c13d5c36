//! Printing the headless commands' results: a write to a closed pipe (`... | head -1`)
//! becomes an error that `main` ends quietly with status 0, as other command-line tools do,
//! instead of `println!`'s panic.

use std::io::{self, Write};

/// Writes to stdout; the error is the pipe's, for `?`.
pub fn write(args: std::fmt::Arguments<'_>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()
}

/// Whether an error is, somewhere in its chain, a write to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
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

//! The command line: its flags (`args`), what each command does (`commands`) and the
//! headless printer of an apply (`printer`). `main.rs` only parses, runs and maps the exit code.

pub mod args;
pub mod commands;
pub mod printer;

//! The command line: its flags (`args`), what each command does (`commands`) and the
//! headless printer of an apply (`printer`),
//! stdout that a closed pipe ends quietly (`out`). `main.rs` only parses, runs and maps the exit code.

pub mod args;
pub mod commands;
pub mod out;
pub mod printer;
pub mod suggest;

//! The interactive terminal front end (see the TUI issue); it talks to the engine only through owned messages.

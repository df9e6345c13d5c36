//! TUI tests: update driven by synthetic engine events, and screen snapshots.

//! Files the tool writes for the operator (plans, exports): created new with mode 0600, so
//! nothing is ever overwritten and nobody else can read them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{Error, Result};

/// Creates `path`, which must not exist yet, with mode 0600.
pub fn create_new(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Opens `path` for appending, creating it with mode 0600 when it is missing.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// Writes `bytes` to a new file at `path` and syncs it; an existing file is refused.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = create_new(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Error::file(
            path,
            "already exists; it is never overwritten: choose another name",
        ),
        _ => Error::file_io(path, "cannot create", e),
    })?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::file_io(path, "cannot write", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn new_files_are_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.md");
        write_new(&p, b"one").unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let e = write_new(&p, b"two").unwrap_err().to_string();
        assert!(e.contains("never overwritten"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
    }
}

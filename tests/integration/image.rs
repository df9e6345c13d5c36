//! The image of `deploy/`: the binary statically linked (as `scripts/image` links it) runs in
//! an empty root that holds only itself and the CA file, and the image `scripts/image`
//! builds from it with buildah holds exactly those two files. `scripts/test` links the
//! static binary and names it in `IDMIG_STATIC_BIN`; where it, root or buildah is missing,
//! the test says so and is counted as skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::control_plane::skip;

/// The statically linked binary, or why there is none.
fn static_bin(test: &str) -> Option<PathBuf> {
    match std::env::var("IDMIG_STATIC_BIN") {
        Ok(p) if Path::new(&p).is_file() => Some(PathBuf::from(p)),
        _ => {
            skip(
                test,
                "no statically linked binary: IDMIG_STATIC_BIN is not set (scripts/test links one)",
            );
            None
        }
    }
}

const CA: &str = "/etc/ssl/certs/ca-certificates.crt";

#[test]
fn the_static_binary_runs_in_an_empty_root_with_only_the_ca_file_beside_it() {
    const TEST: &str = "image::the_static_binary_runs_in_an_empty_root";
    let Some(bin) = static_bin(TEST) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    for (from, to) in [
        (bin.as_path(), "usr/local/bin/cilium-idmig"),
        (Path::new(CA), &CA[1..]),
    ] {
        let to = root.path().join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    }
    let in_root = |args: &[&str]| {
        Command::new("/usr/sbin/chroot")
            .arg(root.path())
            .arg("/usr/local/bin/cilium-idmig")
            .args(args)
            .env_clear()
            .output()
            .unwrap()
    };
    let version = in_root(&["--version"]);
    if !version.status.success() && String::from_utf8_lossy(&version.stderr).contains("chroot") {
        return skip(TEST, "chroot needs root");
    }
    assert!(
        version.status.success(),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );
    let said = String::from_utf8_lossy(&version.stdout);
    assert!(
        said.starts_with(&format!("cilium-idmig {}", env!("CARGO_PKG_VERSION"))),
        "{said}"
    );
    let help = in_root(&["sync", "--help"]);
    assert!(
        help.status.success(),
        "{}",
        String::from_utf8_lossy(&help.stderr)
    );
    assert!(String::from_utf8_lossy(&help.stdout).contains("--decisions"));
    // The same binary outside any root needs no loader either.
    let elf = Command::new("readelf")
        .arg("-l")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&elf.stdout).contains("INTERP"));
}

#[test]
fn the_image_holds_the_static_binary_and_the_ca_certificates_and_nothing_else() {
    const TEST: &str = "image::the_image_holds";
    let Some(bin) = static_bin(TEST) else {
        return;
    };
    if Command::new("buildah").arg("--version").output().is_err() {
        return skip(TEST, "no buildah (Debian package buildah)");
    }
    let tag = format!("localhost/cilium-idmig:test-{}", std::process::id());
    let built = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/image"))
        .arg("--binary")
        .arg(&bin)
        .arg(&tag)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let buildah = |args: &[&str]| {
        let out = Command::new("buildah").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "buildah {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let container = buildah(&["from", &tag]);
    let mounted = PathBuf::from(buildah(&["mount", &container]));
    let mut files = Vec::new();
    let mut dirs = vec![mounted.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            match p.is_dir() {
                true => dirs.push(p),
                false => files.push(p.strip_prefix(&mounted).unwrap().display().to_string()),
            }
        }
    }
    files.sort();
    let same_binary =
        std::fs::read(mounted.join("usr/local/bin/cilium-idmig")).ok() == std::fs::read(&bin).ok();
    let config = buildah(&[
        "inspect",
        "--format",
        "{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}",
        &tag,
    ]);
    buildah(&["umount", &container]);
    buildah(&["rm", &container]);
    buildah(&["rmi", &tag]);
    assert_eq!(
        files,
        [
            "etc/ssl/certs/ca-certificates.crt",
            "usr/local/bin/cilium-idmig"
        ]
    );
    assert!(same_binary);
    assert_eq!(config, "65532:65532 [/usr/local/bin/cilium-idmig]");
}

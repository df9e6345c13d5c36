//! Who runs the tool, as the audit trail names them: `--operator NAME` for shared accounts,
//! else the person behind sudo (`alice@host (via sudo as root)`), else the account from the
//! password database (not `USER`, which tmux, cron and su leave stale or unset).

use std::sync::OnceLock;

/// The `--operator` name, set once at start (one process acts for one person).
static EXPLICIT: OnceLock<String> = OnceLock::new();

/// Records `--operator NAME` for every later `current()`.
pub fn set_explicit(name: &str) {
    let _ = EXPLICIT.set(name.trim().to_string());
}

/// The operator of this process, for the decision log and the plan file.
pub fn current() -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let account = account_name(uid);
    describe(
        EXPLICIT.get().map(String::as_str),
        std::env::var("SUDO_USER").ok().as_deref(),
        account.as_deref(),
        uid,
        &hostname(),
    )
}

/// The rules, without the environment: `explicit` wins, then a sudo caller, then the account.
fn describe(
    explicit: Option<&str>,
    sudo_user: Option<&str>,
    account: Option<&str>,
    uid: u32,
    host: &str,
) -> String {
    let account = account.map_or_else(|| format!("uid{uid}"), str::to_string);
    match (
        explicit.filter(|e| !e.is_empty()),
        sudo_user.filter(|s| !s.is_empty()),
    ) {
        (Some(name), Some(via)) => format!("{name}@{host} (as {via} via sudo as {account})"),
        (Some(name), None) if name != account => format!("{name}@{host} (as {account})"),
        (Some(name), None) => format!("{name}@{host}"),
        (None, Some(via)) if via != account => format!("{via}@{host} (via sudo as {account})"),
        (None, _) => format!("{account}@{host}"),
    }
}

/// The account name of `uid` from the password database (NSS, so LDAP users too).
fn account_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: an all-zero passwd is a valid value for getpwuid_r to fill in.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buf` outlives the use of `pwd`'s
    // string pointers below.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so pw_name points at a NUL-terminated string in `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// This machine's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_person_not_just_the_account() {
        assert_eq!(
            describe(None, None, Some("alice"), 1000, "bastion"),
            "alice@bastion"
        );
        assert_eq!(
            describe(None, Some("alice"), Some("root"), 0, "bastion"),
            "alice@bastion (via sudo as root)"
        );
        assert_eq!(
            describe(Some("bob"), None, Some("deploy"), 1001, "bastion"),
            "bob@bastion (as deploy)"
        );
        assert_eq!(
            describe(Some("bob"), Some("alice"), Some("root"), 0, "bastion"),
            "bob@bastion (as alice via sudo as root)"
        );
        assert_eq!(describe(None, None, None, 4242, "h"), "uid4242@h");
        assert_eq!(describe(Some(""), Some(""), Some("root"), 0, "h"), "root@h");
    }

    #[test]
    fn the_account_comes_from_the_password_database() {
        // uid 0 is root on every system this runs on, whatever USER says.
        assert_eq!(account_name(0).as_deref(), Some("root"));
    }
}

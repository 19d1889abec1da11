//! Who the agent is, and who its commands are, where no user namespace
//! stands between them (the `docker` tier).
//!
//! Inside a container every process sees one `/proc`. The kernel decides
//! who may open `/proc/1/fd`, write `/proc/1/oom_score_adj`, signal or
//! ptrace the agent by comparing uids; with every capability dropped that
//! comparison is all that is left. So if the agent and its commands shared
//! a uid, a command could do all of those. The `local` tier avoids it with a
//! user namespace (the agent's memory map belongs to a uid the sandbox does
//! not map); a container runs both in one, so here the agent takes a uid of
//! its own:
//!
//! 1. [`tighten_mounts`], while the agent still holds CAP_SYS_ADMIN: every
//!    mount but /dev's and /proc's is made nosuid,nodev (the Engine API has
//!    no such option for the root and bind mounts), and /sys with what is
//!    under it is detached: the host's sysfs and cgroup trees are nothing a
//!    sandbox needs, and masking only hid them.
//! 2. [`take_agent_ids`]: real, effective, saved and file-system ids become
//!    [`AGENT_UID`]; the agent reads its token and binds its socket in a run
//!    directory the host made its own, then [`hide_mounts`] detaches that
//!    directory and the agent binary where the link does not need them.
//! 3. [`finish`]: the file-system ids become the command user's, so files
//!    the agent writes are the user's and its access checks are the user's
//!    (a kernel without setfsuid — gVisor's — gets the agent CAP_DAC_* and
//!    CAP_CHOWN instead, and [`give_to_user`] on every file it creates).
//!    Of capabilities it keeps CAP_SETUID, CAP_SETGID and CAP_SETPCAP, to
//!    start commands as the user with nothing, and CAP_KILL, to signal them;
//!    the bounding set keeps no more. It stays dumpable on purpose: /proc/1
//!    then belongs to AGENT_UID rather than to root, and a command, being
//!    another uid, can neither open it nor ptrace the agent.
//! 4. [`enter_command_identity`], between fork and exec of every command:
//!    the user's ids and groups, an empty bounding set, no capability left in
//!    any set. no_new_privs (set by the container) keeps exec from giving
//!    any back.

use std::path::Path;
use std::sync::OnceLock;

use rustix::process::{Gid, Uid};

/// The agent's uid and gid in a container.
pub const AGENT_UID: u32 = namzu_proto::CONTAINER_AGENT_UID;

/// Capabilities the agent keeps after [`finish`].
const KEPT: [caps::Capability; 4] = [
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_SETPCAP,
    caps::Capability::CAP_KILL,
];

/// Kept only where the kernel has no file-system ids (gVisor's 2022
/// Sentry answers setfsuid with ENOSYS): the agent then works on files as
/// itself with these, and gives every file it creates to the command user.
const FS_FALLBACK: [caps::Capability; 4] = [
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_DAC_READ_SEARCH,
    caps::Capability::CAP_FOWNER,
    caps::Capability::CAP_CHOWN,
];

/// A failed step of taking the agent's identity; the agent does not serve
/// after one.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("user {spec:?}: {reason}")]
    User { spec: String, reason: String },
    #[error("{step}: {source}")]
    Os {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("capabilities: {0}")]
    Caps(String),
    #[error("the user {uid} is the agent's own uid; pick another")]
    AgentUid { uid: u32 },
}

/// Who commands run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandUser {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group included).
    pub groups: Vec<u32>,
    /// From /etc/passwd, when the user is listed there.
    pub home: Option<String>,
}

/// rustix's id constructors are `unsafe` only because `u32::MAX` means
/// "unchanged" to the kernel; [`resolve_user`] refuses it.
fn uid(n: u32) -> Uid {
    assert_ne!(n, u32::MAX);
    #[allow(unsafe_code)]
    // SAFETY: not u32::MAX, asserted above.
    unsafe {
        Uid::from_raw(n)
    }
}

fn gid(n: u32) -> Gid {
    assert_ne!(n, u32::MAX);
    #[allow(unsafe_code)]
    // SAFETY: not u32::MAX, asserted above.
    unsafe {
        Gid::from_raw(n)
    }
}

static COMMAND_USER: OnceLock<(CommandUser, Vec<Gid>)> = OnceLock::new();

/// Resolves a container `User` string (`""`, `name`, `uid`, `name:group`,
/// `uid:gid`) against `etc/passwd` and `etc/group` under `root`, the way
/// Docker does: a name must be listed; a bare number need not be (its group
/// is then 0); supplementary groups are those listing the user's name.
pub fn resolve_user(spec: &str, root: &Path) -> Result<CommandUser, IdentityError> {
    let err = |reason: String| IdentityError::User {
        spec: spec.to_owned(),
        reason,
    };
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap_or_default();
    let (user, grp) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let user = if user.is_empty() { "0" } else { user };
    let entries = passwd.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7).then(|| (f[0], f[2].parse::<u32>().ok(), f[3].parse::<u32>().ok(), f[5]))
    });
    let mut found = None;
    for (name, uid, gid, home) in entries {
        let hit = match user.parse::<u32>() {
            Ok(n) => uid == Some(n),
            Err(_) => name == user,
        };
        if hit {
            found = Some((name.to_owned(), uid, gid, home.to_owned()));
            break;
        }
    }
    let (name, uid, pgid, home) = match (found, user.parse::<u32>()) {
        (Some((n, Some(u), g, h)), _) => (Some(n), u, g.unwrap_or(0), Some(h)),
        (None, Ok(u)) => (None, u, 0, None),
        _ => return Err(err("no such user in /etc/passwd".into())),
    };
    let groups_table: Vec<(&str, Option<u32>, Vec<&str>)> = group
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 4).then(|| {
                (
                    f[0],
                    f[2].parse().ok(),
                    f[3].split(',').filter(|m| !m.is_empty()).collect(),
                )
            })
        })
        .collect();
    let gid = match grp {
        None | Some("") => pgid,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => groups_table
                .iter()
                .find(|(n, _, _)| *n == g)
                .and_then(|(_, id, _)| *id)
                .ok_or_else(|| err(format!("no group {g:?} in /etc/group")))?,
        },
    };
    let mut groups = vec![gid];
    if let Some(name) = &name {
        for (_, id, members) in &groups_table {
            if let Some(id) = id {
                if members.contains(&name.as_str()) && !groups.contains(id) {
                    groups.push(*id);
                }
            }
        }
    }
    if uid == u32::MAX || groups.contains(&u32::MAX) {
        return Err(err("4294967295 is not an id".into()));
    }
    if uid == AGENT_UID {
        return Err(IdentityError::AgentUid { uid });
    }
    Ok(CommandUser { uid, gid, groups, home })
}

/// Makes every mount but /dev's and /proc's nosuid,nodev and detaches /sys.
/// Needs CAP_SYS_ADMIN; runs before any thread or command exists. Returns
/// what it did and what the boundary refused (gVisor, for one, neither
/// lists nor changes those flags), for Health's hardening report.
pub fn tighten_mounts() -> String {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut sys: Vec<String> = Vec::new();
    let (mut tightened, mut refused) = (0usize, Vec::new());
    for line in info.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(point), Some(opts)) = (f.get(4), f.get(5)) else {
            continue;
        };
        if *point == "/sys" || point.starts_with("/sys/") {
            sys.push((*point).to_owned());
            continue;
        }
        if *point == "/dev" || point.starts_with("/dev/") || point.starts_with("/proc") {
            continue;
        }
        let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        let mut already = (false, false);
        for o in opts.split(',') {
            match o {
                "ro" => flags |= MsFlags::MS_RDONLY,
                "noexec" => flags |= MsFlags::MS_NOEXEC,
                "noatime" => flags |= MsFlags::MS_NOATIME,
                "nodiratime" => flags |= MsFlags::MS_NODIRATIME,
                "relatime" => flags |= MsFlags::MS_RELATIME,
                "nosuid" => already.0 = true,
                "nodev" => already.1 = true,
                _ => {}
            }
        }
        if already == (true, true) {
            continue;
        }
        match mount(None::<&str>, *point, None::<&str>, flags, None::<&str>) {
            Ok(()) => tightened += 1,
            Err(e) => refused.push(format!("{point} ({e})")),
        }
    }
    // Deepest first, so each is still reachable by its path.
    sys.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let mut detached = 0usize;
    for p in &sys {
        match umount2(p.as_str(), MntFlags::MNT_DETACH) {
            Ok(()) => detached += 1,
            Err(e) => refused.push(format!("umount {p} ({e})")),
        }
    }
    let mut report = format!(
        "nosuid,nodev added on {tightened}; /sys: {detached} of {} detached",
        sys.len()
    );
    if !refused.is_empty() {
        report.push_str(&format!("; refused: {}", refused.join(", ")));
    }
    report
}

/// Takes the agent's ids (see the module docs). CAP_SYS_ADMIN is kept until
/// [`finish`], for [`hide_mounts`]; between the two the agent's file-system
/// ids are its own, so it reads its token and binds its socket in a run
/// directory only it may enter. Must run while the process has one thread:
/// ids and capabilities are per thread in the kernel, and threads started
/// later inherit them.
pub fn take_agent_ids(user: &CommandUser) -> Result<(), IdentityError> {
    use caps::{CapSet, CapsHashSet};
    let os = |step| move |e: rustix::io::Errno| IdentityError::Os { step, source: e.into() };
    let ce = |e: caps::errors::CapsError| IdentityError::Caps(e.to_string());
    let mut kept: CapsHashSet = KEPT.into_iter().collect();
    kept.insert(caps::Capability::CAP_SYS_ADMIN);
    let permitted = caps::read(None, CapSet::Permitted).map_err(ce)?;
    // Given or not by the host; whether they stay is decided in `finish`.
    kept.extend(FS_FALLBACK.into_iter().filter(|c| permitted.contains(c)));
    if let Some(missing) = kept.iter().find(|c| !permitted.contains(c)) {
        return Err(IdentityError::Caps(format!(
            "the agent needs {missing} at start, and was not given it"
        )));
    }
    let groups: Vec<Gid> = user.groups.iter().map(|g| gid(*g)).collect();
    rustix::thread::set_keep_capabilities(true).map_err(os("keep capabilities"))?;
    rustix::thread::set_thread_groups(&groups).map_err(os("setgroups"))?;
    let (au, ag) = (uid(AGENT_UID), gid(AGENT_UID));
    rustix::thread::set_thread_res_gid(ag, ag, ag).map_err(os("setresgid"))?;
    rustix::thread::set_thread_res_uid(au, au, au).map_err(os("setresuid"))?;
    rustix::thread::set_keep_capabilities(false).map_err(os("keep capabilities"))?;
    // Leaving uid 0 emptied the effective set; CAP_SETPCAP is needed back
    // to shrink the bounding set.
    caps::set(None, CapSet::Effective, &kept).map_err(ce)?;
    let keep_bits: Vec<u8> = kept.iter().map(|c| c.index()).collect();
    drop_bounding_except(&keep_bits).map_err(|source| IdentityError::Os {
        step: "shrink the bounding set",
        source,
    })?;
    caps::set(None, CapSet::Permitted, &kept).map_err(ce)?;
    caps::clear(None, CapSet::Inheritable).map_err(ce)?;
    clear_ambient().map_err(|source| IdentityError::Os {
        step: "clear the ambient set",
        source,
    })?;
    Ok(())
}

/// Detaches mounts commands have no business seeing (the host's run
/// directory and agent binary, once the socket is bound and the binary
/// running). Between [`take_agent_ids`] and [`finish`].
pub fn hide_mounts(paths: &[std::path::PathBuf]) -> String {
    let mut hidden = Vec::new();
    for p in paths {
        match nix::mount::umount2(p.as_path(), nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => hidden.push(p.display().to_string()),
            Err(e) => hidden.push(format!("{} not detached ({e})", p.display())),
        }
    }
    hidden.join(", ")
}

/// Drops CAP_SYS_ADMIN from every set, takes the command user's
/// file-system ids, and records `user` for [`enter_command_identity`].
pub fn finish(user: CommandUser) -> Result<String, IdentityError> {
    use caps::CapSet;
    let ce = |e: caps::errors::CapsError| IdentityError::Caps(e.to_string());
    // setfsuid reports the previous id, never an error: read it back.
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(user.uid));
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(user.gid));
    let by_fsuid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(user.uid)).as_raw() == user.uid;
    let permitted = caps::read(None, CapSet::Permitted).map_err(ce)?;
    let mut keep: Vec<caps::Capability> = KEPT.to_vec();
    if !by_fsuid {
        if let Some(missing) = FS_FALLBACK.iter().find(|c| !permitted.contains(c)) {
            return Err(IdentityError::Caps(format!(
                "this kernel has no setfsuid, and without {missing} the agent cannot work on files for the command user"
            )));
        }
        keep.extend(FS_FALLBACK);
    }
    drop_bounding_except(&keep.iter().map(|c| c.index()).collect::<Vec<_>>()).map_err(|source| IdentityError::Os {
        step: "shrink the bounding set",
        source,
    })?;
    let keep_set: caps::CapsHashSet = keep.iter().copied().collect();
    caps::set(None, CapSet::Effective, &keep_set).map_err(ce)?;
    caps::set(None, CapSet::Permitted, &keep_set).map_err(ce)?;
    // Every id change above reset it; see the module docs for why it is on.
    nix::sys::prctl::set_dumpable(true).map_err(|e| IdentityError::Os {
        step: "set dumpable",
        source: e.into(),
    })?;
    let names: Vec<String> = keep.iter().map(|c| c.to_string()).collect();
    let files = if by_fsuid {
        "file-system ids the user's"
    } else {
        "no setfsuid: files it creates are given to the user"
    };
    let report = format!(
        "agent uid {AGENT_UID} ({}; {files}), commands uid {} gid {} with no capabilities",
        names.join(", "),
        user.uid,
        user.gid
    );
    let groups = user.groups.iter().map(|g| gid(*g)).collect();
    BY_CHOWN.store(!by_fsuid, std::sync::atomic::Ordering::Relaxed);
    let _ = COMMAND_USER.set((user, groups));
    Ok(report)
}

static BY_CHOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Gives `name` in `dir`, just created by the agent, to the command user
/// where the agent could not take the user's file-system ids; a no-op
/// everywhere else (the file is already the user's, or there is no user).
pub fn give_to_user<Fd: std::os::fd::AsFd, P: rustix::path::Arg>(dir: Fd, name: P) -> rustix::io::Result<()> {
    if !BY_CHOWN.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let Some((user, _)) = COMMAND_USER.get() else {
        return Ok(());
    };
    rustix::fs::chownat(
        dir,
        name,
        Some(uid(user.uid)),
        Some(gid(user.gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
}

/// Empties the ambient set; a kernel without one (gVisor's, EINVAL) holds
/// nothing there.
fn clear_ambient() -> std::io::Result<()> {
    match rustix::thread::clear_ambient_capability_set() {
        Err(rustix::io::Errno::INVAL) | Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Who commands run as, if [`finish`] ran.
pub fn command_user() -> Option<&'static CommandUser> {
    COMMAND_USER.get().map(|(u, _)| u)
}

/// Whether commands run as a user of their own (a container's), entered
/// by a pre-exec hook ([`prepare`]).
pub fn command_user_set() -> bool {
    COMMAND_USER.get().is_some()
}

/// Registers, as the first pre-exec step of `cmd`, the switch to the
/// command user (see [`enter_command_identity`]). A no-op where the agent
/// did not take an identity of its own.
pub fn prepare(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    if COMMAND_USER.get().is_none() {
        return;
    }
    #[allow(unsafe_code)]
    // SAFETY: enter_command_identity makes raw syscalls only and reads
    // memory set before any fork.
    unsafe {
        cmd.pre_exec(enter_command_identity);
    }
}

/// Drops every capability but `keep` from the bounding set, by number:
/// the kernel (or gVisor) answers EINVAL past the last one it knows, which
/// is skipped. Raw prctl only, so it is safe between fork and exec.
fn drop_bounding_except(keep: &[u8]) -> std::io::Result<()> {
    for cap in 0u8..64 {
        if keep.contains(&cap) {
            continue;
        }
        #[allow(unsafe_code)]
        // SAFETY: prctl with integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Between fork and exec: the command user's ids and groups, and no
/// capability in any set. Async-signal-safe: raw syscalls on memory set
/// before the fork.
pub fn enter_command_identity() -> std::io::Result<()> {
    let Some((user, groups)) = COMMAND_USER.get() else {
        return Ok(());
    };
    drop_bounding_except(&[])?;
    let (uid, gid) = (uid(user.uid), gid(user.gid));
    rustix::thread::set_thread_groups(groups)?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: rustix::thread::CapabilityFlags::empty(),
            permitted: rustix::thread::CapabilityFlags::empty(),
            inheritable: rustix::thread::CapabilityFlags::empty(),
        },
    )?;
    clear_ambient()?;
    // The id change made the child non-dumpable, so its /proc entries would
    // be root's; a user other than root could not then set its own
    // oom_score_adj. exec makes it dumpable again anyway.
    #[allow(unsafe_code)]
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(passwd: &str, group: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/passwd"), passwd).unwrap();
        std::fs::write(d.path().join("etc/group"), group).unwrap();
        d
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\napp:x:1001:\ndocker:x:998:app,other\nwheel:x:10:root\n";

    #[test]
    fn users_resolve_like_docker() {
        let d = root_with(PASSWD, GROUP);
        let r = |s: &str| resolve_user(s, d.path());
        let root = r("").unwrap();
        assert_eq!((root.uid, root.gid, root.groups.clone()), (0, 0, vec![0, 10]));
        assert_eq!(root.home.as_deref(), Some("/root"));
        let app = r("app").unwrap();
        assert_eq!((app.uid, app.gid, app.groups.clone()), (1000, 1001, vec![1001, 998]));
        assert_eq!(r("1000").unwrap(), app);
        assert_eq!(r("app:root").unwrap().gid, 0);
        assert_eq!(r("app:5").unwrap().groups, vec![5, 998]);
        let stranger = r("4242").unwrap();
        assert_eq!((stranger.uid, stranger.gid, stranger.home), (4242, 0, None));
        assert!(matches!(r("ghost"), Err(IdentityError::User { .. })));
        assert!(matches!(r("app:ghosts"), Err(IdentityError::User { .. })));
        assert!(matches!(r(&AGENT_UID.to_string()), Err(IdentityError::AgentUid { .. })));
    }
}

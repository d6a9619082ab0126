//! What mcqemu's agent needs inside an image's root to run programs as the image says:
//! `/.mcqemu/image`, with the image's Env (PATH and HOME filled in as Docker fills them),
//! WorkingDir, and User resolved to numbers from the root's own /etc/passwd and /etc/group
//! (the guest has no name service to ask). mcqemu writes it, never the image: an entry of
//! that name from a layer is replaced. The agent reads it as `src/agent/root.rs` says.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;

use super::error::OciError;
use super::layout::RunConfig;
use super::unpack::{FileType, Meta};
use crate::state::tree::Folder;

/// The folder in the root that is mcqemu's.
pub const DIR: &str = ".mcqemu";
/// The config's name in it.
pub const FILE: &str = "image";
/// Docker's PATH for an image that sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Writes the config of `c` into `root` and notes its entries in `meta` (owned by root).
pub fn place(
    root: &Folder,
    meta: &mut BTreeMap<Vec<u8>, Meta>,
    c: &RunConfig,
) -> Result<(), OciError> {
    let host = |what: &str, e: std::io::Error| OciError::Host(format!("{what} in the root: {e}"));
    let etc = |name: &str| read_etc(root, name);
    let text = render(c, &etc("passwd"), &etc("group"))?;
    let dir = OsStr::new(DIR);
    match root.meta(dir) {
        Ok(_) => root
            .remove_all(dir)
            .map_err(|e| host("removing the image's /.mcqemu", e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(host("/.mcqemu", e)),
    }
    meta.retain(|p, _| p.as_slice() != DIR.as_bytes() && !p.starts_with(b".mcqemu/"));
    root.mkdir(dir).map_err(|e| host("/.mcqemu", e))?;
    let sub = root.sub(dir).map_err(|e| host("/.mcqemu", e))?;
    sub.chmod_self(0o755).map_err(|e| host("/.mcqemu", e))?;
    let mut f = sub
        .create(OsStr::new(FILE))
        .map_err(|e| host("/.mcqemu/image", e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| host("/.mcqemu/image", e))?;
    let owned = |kind, mode| Meta {
        kind,
        uid: 0,
        gid: 0,
        mode,
        xattrs: Vec::new(),
    };
    meta.insert(DIR.as_bytes().to_vec(), owned(FileType::Dir, 0o755));
    meta.insert(
        format!("{DIR}/{FILE}").into_bytes(),
        owned(FileType::File, 0o644),
    );
    Ok(())
}

/// `/etc/NAME` of the root, or nothing when it is missing, a link or unreadable (a numeric
/// user still works then; a named one is refused by [`render`]).
fn read_etc(root: &Folder, name: &str) -> String {
    let mut s = String::new();
    if let Ok(mut f) = root
        .sub(OsStr::new("etc"))
        .and_then(|etc| etc.open_file(OsStr::new(name)))
    {
        let _ = Read::by_ref(&mut f).take(1 << 20).read_to_string(&mut s);
    }
    s
}

/// The config's text: `env NAME=value` lines, `workdir PATH`, `user UID GID`.
pub fn render(c: &RunConfig, passwd: &str, group: &str) -> Result<String, OciError> {
    let (uid, gid, home) = user(&c.user, passwd, group)?;
    let mut out = String::new();
    let has = |k: &str| {
        c.env
            .iter()
            .any(|e| e.split_once('=').is_some_and(|(n, _)| n == k))
    };
    if !has("PATH") {
        out.push_str(&format!("env PATH={DEFAULT_PATH}\n"));
    }
    if !has("HOME") {
        out.push_str(&format!("env HOME={home}\n"));
    }
    for e in &c.env {
        // A value across lines cannot be said in this format; such an entry is left out.
        if e.contains('=') && !e.starts_with('=') && !e.contains('\n') {
            out.push_str(&format!("env {e}\n"));
        }
    }
    if c.working_dir.starts_with('/') && !c.working_dir.contains('\n') {
        out.push_str(&format!("workdir {}\n", c.working_dir));
    }
    out.push_str(&format!("user {uid} {gid}\n"));
    Ok(out)
}

/// An image's `User` (`name`, `uid`, `name:group`, `uid:gid`; empty is root) as uid, gid and
/// home folder.
fn user(spec: &str, passwd: &str, group: &str) -> Result<(u32, u32, String), OciError> {
    if spec.is_empty() {
        return Ok((0, 0, "/root".into()));
    }
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 6 && (f[0] == u || (u.parse::<u32>().is_ok() && f[2] == u)));
    let uid = match (u.parse::<u32>(), &entry) {
        (Ok(n), _) => n,
        (Err(_), Some(f)) => f[2].parse().map_err(|_| bad_user(spec, "its uid"))?,
        (Err(_), None) => return Err(bad_user(spec, "the user in /etc/passwd")),
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => group
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| bad_user(spec, "the group in /etc/group"))?,
        },
        None => entry
            .as_ref()
            .and_then(|f| f[3].parse().ok())
            .unwrap_or(uid),
    };
    let home = entry
        .as_ref()
        .map(|f| f[5].to_string())
        .filter(|h| h.starts_with('/'))
        .unwrap_or_else(|| "/".into());
    Ok((uid, gid, home))
}

fn bad_user(spec: &str, what: &str) -> OciError {
    OciError::Invalid(format!(
        "the image's User {spec:?} cannot be resolved: the root has no {what}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\napp:x:1001:\n";

    fn config(user: &str, env: &[&str], wd: &str) -> RunConfig {
        RunConfig {
            env: env.iter().map(|s| s.to_string()).collect(),
            working_dir: wd.into(),
            user: user.into(),
            ..RunConfig::default()
        }
    }

    #[test]
    fn users_resolve_by_name_number_and_group() {
        assert_eq!(user("", PASSWD, GROUP).unwrap(), (0, 0, "/root".into()));
        assert_eq!(
            user("app", PASSWD, GROUP).unwrap(),
            (1000, 1001, "/home/app".into())
        );
        assert_eq!(
            user("1000", PASSWD, GROUP).unwrap(),
            (1000, 1001, "/home/app".into())
        );
        assert_eq!(user("app:staff", PASSWD, GROUP).unwrap().1, 50);
        assert_eq!(user("4242:7", "", "").unwrap(), (4242, 7, "/".into()));
        assert_eq!(user("4242", "", "").unwrap(), (4242, 4242, "/".into()));
        let e = user("nobody", PASSWD, GROUP).unwrap_err().to_string();
        assert!(e.contains("nobody") && e.contains("/etc/passwd"), "{e}");
        assert!(user("app:nogroup", PASSWD, GROUP).is_err());
    }

    #[test]
    fn the_config_fills_path_and_home_and_drops_what_it_cannot_say() {
        let t = render(
            &config("app", &["A=1", "B=x\ny", "=z"], "/srv"),
            PASSWD,
            GROUP,
        )
        .unwrap();
        assert_eq!(
            t,
            format!("env PATH={DEFAULT_PATH}\nenv HOME=/home/app\nenv A=1\nworkdir /srv\nuser 1000 1001\n")
        );
        let t = render(&config("", &["PATH=/x", "HOME=/h"], ""), "", "").unwrap();
        assert_eq!(t, "env PATH=/x\nenv HOME=/h\nuser 0 0\n");
    }
}

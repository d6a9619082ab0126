//! guest_copy_in and guest_copy_out over MCP, against the built binary, the real QEMU (TCG
//! here) and the test guest (busybox tar): trees arrive exact (content, modes, links as
//! links), host paths outside the roots are refused both ways with nothing written, a hostile
//! guest's archive cannot write under a symlink it made, and existing destinations need
//! overwrite.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use mcqemu::b64;
use serde_json::{json, Value};

/// Bound for calls that boot or wait on a guest, or move many MiB through the agent.
const SLOW: Duration = Duration::from_secs(300);

/// Boots the test guest as `name` (256 MiB, 1 vCPU) and waits for its agent.
fn boot(e: &mut Lab, name: &str) {
    e.boot_test_guest(name, 256);
}

fn call(e: &mut Lab, tool: &str, args: Value) -> Value {
    e.srv().call_ok_within(tool, args, SLOW)
}

/// A call that must fail with an error of `kind`; its text.
fn refused_as(e: &mut Lab, tool: &str, args: Value, kind: &str) -> String {
    let r = e.srv().call_tool_within(tool, args, SLOW);
    let text = tool_err(&r, tool);
    assert_eq!(error_kind(&r), kind, "{tool}: {text}");
    text
}

fn refused(e: &mut Lab, tool: &str, args: Value) -> String {
    refused_as(e, tool, args, "refused")
}

/// `sha256  ./path` lines of every regular file under `root`, sorted, as sha256sum prints.
fn host_manifest(root: &Path) -> String {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let ft = e.file_type().unwrap();
            let r = format!("{rel}/{name}");
            if ft.is_dir() {
                walk(&e.path(), &r, out);
            } else if ft.is_file() {
                out.push(format!(
                    "{}  {r}",
                    sha256_hex(&std::fs::read(e.path()).unwrap())
                ));
            }
        }
    }
    let mut v = Vec::new();
    walk(root, ".", &mut v);
    v.sort();
    v.join("\n")
}

/// The tree copied in: hundreds of small files in nested folders, an executable, a 3 MiB
/// binary, a long name, a hidden file, a link inside the tree and one to a host file outside.
fn make_tree(src: &Path, secret: &Path) -> usize {
    let mut n = 0;
    for a in 0..6 {
        for b in 0..5 {
            let d = src.join(format!("dir{a}/sub{b}/deeper"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..10 {
                let body = pseudo_random(100 + 37 * f + a * b, (a * 100 + b * 10 + f) as u64);
                std::fs::write(d.join(format!("file{f}.dat")), body).unwrap();
                n += 1;
            }
        }
    }
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::write(src.join("bin/run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(
        src.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::fs::write(src.join("big.bin"), pseudo_random(3 << 20, 7)).unwrap();
    std::fs::write(
        src.join(format!("{}.txt", "long".repeat(40))),
        b"long name\n",
    )
    .unwrap();
    std::fs::write(src.join(".hidden"), b"HIDDEN-MARKER\n").unwrap();
    std::os::unix::fs::symlink("bin/run.sh", src.join("inner")).unwrap();
    std::os::unix::fs::symlink(secret, src.join("outer")).unwrap();
    n + 3
}

#[test]
fn copy_in_and_out_of_a_guest() {
    test_guest();
    let mut e = Lab::confined("copy");
    let vm = "cp";
    boot(&mut e, vm);
    // Outside every root of a confined lab's server, wherever the checkout is; removed on drop.
    let outside = TempDir::new("guest-copy-outside");
    let out = outside.path().to_path_buf();
    let secret = out.join("secret.txt");
    std::fs::write(&secret, b"HOST-SECRET-MARKER\n").unwrap();
    let src = e.dir.subdir("src");
    let files = make_tree(&src, &secret);

    tree_in_checks(&mut e, vm, &src, &secret, files);
    roots_checks(&mut e, vm, &src, &secret, &out);
    cap_checks(&mut e, vm, &src);
    copy_out_checks(&mut e, vm, &out);
    fallback_check(&mut e, vm, &src);
}

/// A guest that shows no data channel port copies through the agent, and says so.
fn fallback_check(e: &mut Lab, vm: &str, src: &Path) {
    e.guest_sh(vm, "mount -t tmpfs none /sys/class/virtio-ports");
    let r_in = call(
        e,
        "guest_copy_in",
        json!({"name": vm, "host_path": src, "guest_path": "/tmp/by-agent"}),
    );
    assert_eq!(r_in["via"], json!("agent"), "{r_in}");
    assert!(
        r_in["via_reason"]
            .as_str()
            .is_some_and(|w| w.contains("org.mcqemu.data.0")),
        "{r_in}"
    );
    let dest = e.dir.join("by-agent");
    let r = call(
        e,
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/by-agent", "host_path": dest.to_str().unwrap()}),
    );
    assert_eq!(r["via"], json!("agent"), "{r}");
    assert_eq!(
        (r["files"].clone(), r["bytes"].clone()),
        (r_in["files"].clone(), r_in["bytes"].clone())
    );
    e.guest_sh(vm, "umount /sys/class/virtio-ports");
}

/// A tree in as one archive (exact content, modes, links as links, the hidden file and the
/// outside file's content never sent), overwrite, and a single file.
fn tree_in_checks(e: &mut Lab, vm: &str, src: &Path, secret: &Path, files: usize) {
    // A tree in, as one archive.
    let t = Instant::now();
    let r = call(
        e,
        "guest_copy_in",
        json!({"name": vm, "host_path": src.to_str().unwrap(), "guest_path": "/tmp/tree"}),
    );
    eprintln!("copy_in of {files} files: {:?}, {r}", t.elapsed());
    assert_eq!(r["files"], json!(files), "{r}");
    assert_eq!(r["symlinks"], json!(2), "{r}");
    assert_eq!(r["skipped_total"], json!(1), "{r}");
    assert_eq!(r["dirs"], json!(1 + 6 + 30 + 30 + 1), "{r}");
    let mut expected = host_manifest(src);
    expected = expected
        .lines()
        .filter(|l| !l.ends_with("/.hidden"))
        .collect::<Vec<_>>()
        .join("\n");
    let got = e.guest_sh(
        vm,
        "cd /tmp/tree && find . -type f | sort | xargs sha256sum | sort",
    );
    assert_eq!(got.trim(), expected.trim());
    let got = e.guest_sh(
        vm,
        "cd /tmp/tree && stat -c '%a %s' bin/run.sh big.bin && \
        readlink inner && readlink outer && [ -L outer ] && [ ! -e .hidden ] && ./bin/run.sh && \
        grep -rl -e HOST-SECRET -e HIDDEN-MARKER . 2>/dev/null | wc -l; ls -a /tmp",
    );
    assert!(
        got.starts_with(&format!(
            "750 19\n644 {}\nbin/run.sh\n{}\nran\n0\n",
            3 << 20,
            secret.display()
        )),
        "{got}"
    );
    assert!(!got.contains(".mcq-copy"), "a temporary was left: {got}");

    // An existing destination is refused, then replaced with overwrite.
    let err = refused_as(
        e,
        "guest_copy_in",
        json!({"name": vm, "host_path": src.to_str().unwrap(), "guest_path": "/tmp/tree"}),
        "invalid_argument",
    );
    assert!(
        err.contains("already exists") && err.contains("overwrite"),
        "{err}"
    );
    std::fs::write(src.join("bin/run.sh"), "#!/bin/sh\necho again\n").unwrap();
    call(
        e,
        "guest_copy_in",
        json!({"name": vm, "host_path": src.to_str().unwrap(),
        "guest_path": "/tmp/tree", "overwrite": true}),
    );
    assert_eq!(
        e.guest_sh(
            vm,
            "/tmp/tree/bin/run.sh; ls -a /tmp | grep -c mcq-copy || true"
        ),
        "again\n0\n"
    );
    single_file_check(e, vm, src);
}

/// A single file skips tar and keeps its mode.
fn single_file_check(e: &mut Lab, vm: &str, src: &Path) {
    let r = call(
        e,
        "guest_copy_in",
        json!({"name": vm,
        "host_path": src.join("bin/run.sh").to_str().unwrap(), "guest_path": "/tmp/one.sh"}),
    );
    assert_eq!(r["files"], json!(1), "{r}");
    assert_eq!(
        e.guest_sh(vm, "stat -c %a /tmp/one.sh; /tmp/one.sh"),
        "750\nagain\n"
    );
}

/// Host paths outside the roots, both ways: refused, nothing written anywhere.
fn roots_checks(e: &mut Lab, vm: &str, src: &Path, secret: &Path, out: &Path) {
    // Host paths outside the roots, both ways: refused, nothing written anywhere.
    let err = refused(
        e,
        "guest_copy_in",
        json!({"name": vm, "host_path": secret.to_str().unwrap(), "guest_path": "/tmp/stolen"}),
    );
    assert!(err.contains("outside"), "{err}");
    let err = refused(
        e,
        "guest_copy_in",
        json!({"name": vm, "host_path": src.join("outer").to_str().unwrap(), "guest_path": "/tmp/stolen"}),
    );
    assert!(
        err.contains("outside"),
        "a link out of the roots is judged by its target: {err}"
    );
    assert_eq!(
        e.guest_sh(vm, "[ ! -e /tmp/stolen ] && echo none"),
        "none\n"
    );
    let err = refused(
        e,
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/tree", "host_path": out.join("dropped").to_str().unwrap()}),
    );
    assert!(err.contains("outside"), "{err}");
    assert_eq!(list_dir(out), vec!["secret.txt".to_string()]);
}

/// A server with MCQEMU_MAX_COPY_MB=2 refuses a 3 MiB tree before sending it, and a guest
/// tree above the cap before packing it; nothing is written either side.
fn cap_checks(e: &mut Lab, vm: &str, src: &Path) {
    let mut capped = lab_server(e, &[("MCQEMU_MAX_COPY_MB", "2")]);
    // The lab's server keeps its agent connection for 2 s; the channel takes one client.
    std::thread::sleep(Duration::from_secs(3));
    let r = capped.call_tool_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": src.to_str().unwrap(), "guest_path": "/tmp/capped"}),
        SLOW,
    );
    let err = tool_err(&r, "guest_copy_in");
    assert!(err.contains("MCQEMU_MAX_COPY_MB"), "{err}");
    assert_eq!(error_kind(&r), "refused", "{err}");
    let dest = e.dir.join("capped");
    let r = capped.call_tool_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/tree", "host_path": dest.to_str().unwrap()}),
        SLOW,
    );
    let err = tool_err(&r, "guest_copy_out");
    assert!(err.contains("MCQEMU_MAX_COPY_MB"), "{err}");
    assert_eq!(error_kind(&r), "refused", "{err}");
    drop(capped);
    assert!(!dest.exists());
    assert_eq!(
        e.guest_sh(
            vm,
            "[ ! -e /tmp/capped ] && ls -a /tmp /var/tmp 2>/dev/null | grep -c mcq-copy || true"
        ),
        "0\n"
    );
}

/// The guest tree copied out: a 32 MiB file, an executable, a hard link, links out of it
/// (to /etc, /etc/passwd) and one inside it, an old mtime.
const RES_TREE: &str = "mkdir -p /tmp/res/sub && head -c 33554432 /dev/urandom > /tmp/res/big && \
        echo hello > /tmp/res/sub/a && printf '#!/bin/sh\\n' > /tmp/res/x.sh && \
        chmod 751 /tmp/res/x.sh && ln /tmp/res/sub/a /tmp/res/hard && \
        ln -s /etc /tmp/res/etc && ln -s /etc/passwd /tmp/res/sub/passwd && \
        ln -s sub/a /tmp/res/rel && touch -d '2020-01-02 03:04:05' /tmp/res/sub/a";

/// copy_out of a tree with a 32 MiB file and links out of it; overwrite; a hostile archive.
fn copy_out_checks(e: &mut Lab, vm: &str, out: &Path) {
    e.guest_sh(vm, RES_TREE);
    let guest_sums = e.guest_sh(
        vm,
        "cd /tmp/res && find . -type f | sort | xargs sha256sum | sort",
    );
    let before = list_dir(e.dir.path());
    let dest = e.dir.join("res");
    let (r, took, progress) = e
        .srv()
        .try_call_with_token(
            "guest_copy_out",
            json!({"name": vm, "guest_path": "/tmp/res", "host_path": dest.to_str().unwrap()}),
            SLOW,
        )
        .unwrap();
    let r = tool_ok(&r, "guest_copy_out");
    eprintln!(
        "copy_out 32 MiB tree: {took:?} ({:.1} MB/s), {} progress updates, {r}",
        33.5 / took.as_secs_f64(),
        progress.len()
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    // Progress counts bytes against the guest's size of the tree, and says how many files are
    // done (over the channel the copy may end before the first report is due).
    if let Some(last) = progress.last() {
        assert!(
            last["params"]["total"].as_f64().unwrap() >= 33_554_432.0,
            "{last}"
        );
        assert!(
            last["params"]["message"]
                .as_str()
                .unwrap()
                .contains("files"),
            "{last}"
        );
    }
    assert_eq!(host_manifest(&dest).trim(), guest_sums.trim());
    assert_eq!(
        std::fs::read_link(dest.join("etc")).unwrap(),
        Path::new("/etc")
    );
    assert_eq!(
        std::fs::read_link(dest.join("sub/passwd")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        std::fs::read_link(dest.join("rel")).unwrap(),
        Path::new("sub/a")
    );
    let mode = |p: &str| {
        std::fs::symlink_metadata(dest.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("x.sh"), 0o751);
    let mtime = std::fs::metadata(dest.join("sub/a"))
        .unwrap()
        .modified()
        .unwrap();
    let secs = mtime
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (1_577_900_000..1_578_000_000).contains(&secs),
        "mtime {secs}"
    );
    assert_eq!(r["symlinks"], json!(3), "{r}");
    let mut after = list_dir(e.dir.path());
    after.retain(|n| n != "res");
    assert_eq!(after, before, "only the destination appeared beside it");

    out_overwrite_checks(e, vm, &dest);
    hostile_archive_check(e, vm, out);
}

/// An existing host_path is refused without overwrite, replaced with it.
fn out_overwrite_checks(e: &mut Lab, vm: &str, dest: &Path) {
    let err = refused_as(
        e,
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/res/sub", "host_path": dest.to_str().unwrap()}),
        "invalid_argument",
    );
    assert!(err.contains("already exists"), "{err}");
    assert!(dest.join("big").exists());
    call(
        e,
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/res/sub",
        "host_path": dest.to_str().unwrap(), "overwrite": true}),
    );
    assert_eq!(std::fs::read(dest.join("a")).unwrap(), b"hello\n");
    assert!(!dest.join("big").exists());
}

/// A hostile guest sends an entry under a symlink its archive made, pointing outside:
/// refused, nothing written outside, no temporary left. The guest plays it by swapping the
/// /bin/sh that sends the archive; mcqemu-agent sends archives itself, without sh, so this
/// runs on the qemu-ga guest (the host's reader, under test here, is the same for both).
fn hostile_archive_check(e: &mut Lab, vm: &str, out: &Path) {
    if our_agent_answers(e.srv(), vm) {
        eprintln!("hostile archive: skipped, mcqemu-agent sends archives without sh");
        return;
    }
    let mut w = mcqemu::state::tar::Writer::new(Vec::new());
    w.dir(b"evil", 0o755, 0).unwrap();
    w.symlink(b"evil/l", out.as_os_str().as_encoded_bytes(), 0)
        .unwrap();
    w.file(b"evil/l/pwned", 0o644, 0, 4, &mut &b"pwnd"[..])
        .unwrap();
    let ar = w.finish().unwrap();
    e.srv().call_ok(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/evil.tar",
        "content": b64::encode(&ar), "encoding": "base64"}),
    );
    let mut w = mcqemu::state::tar::Writer::new(Vec::new());
    w.dir(b"evil", 0o755, 0).unwrap();
    w.file(b"evil/../../escaped", 0o644, 0, 4, &mut &b"pwnd"[..])
        .unwrap();
    e.srv().call_ok(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/evil-dots.tar",
        "content": b64::encode(&w.finish().unwrap()), "encoding": "base64"}),
    );
    // busybox sh runs its own tar applet whatever /bin/tar is, so the hostile guest swaps
    // /bin/sh itself for a script that writes into the data channel, framed as mcqemu frames
    // it (the nonce is its 6th argument), whatever /tmp/evil-mode asks: a crafted archive,
    // garbage, or an endless stream.
    let fake = r#"#!/bin/busybox sh
for n in /sys/class/virtio-ports/*/name; do read -r v < "$n"; [ "$v" = org.mcqemu.data.0 ] && d=${n%/name} && dev=/dev/${d##*/}; done
exec 3>"$dev" || exit 9
printf 'MCQ-BEGIN %s 0\n' "$6" >&3
case $(cat /tmp/evil-mode) in
tar) cat /tmp/evil.tar >&3; printf 'MCQ-END %s 0\n' "$6" >&3;;
dots) cat /tmp/evil-dots.tar >&3; printf 'MCQ-END %s 0\n' "$6" >&3;;
garbage) head -c 100000 /dev/urandom >&3;;
endless) yes MCQ-END >&3;;
esac
"#;
    e.srv().call_ok(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/fake-sh", "content": fake}),
    );
    e.guest_sh(
        vm,
        "mkdir -p /tmp/evil && chmod 755 /tmp/fake-sh && mv /bin/sh /bin/sh.real && \
        cp /tmp/fake-sh /bin/sh",
    );
    let before = list_dir(e.dir.path());
    // Entries that would leave the destination are refused; bytes that are no archive are
    // the guest's failure.
    for (mode, says, kind) in [
        ("tar", "symlink", "refused"),
        ("dots", "..", "refused"),
        ("garbage", "failed", "guest_failed"),
        ("endless", "failed", "guest_failed"),
    ] {
        e.srv().call_ok(
            "guest_file_write",
            json!({"name": vm, "path": "/tmp/evil-mode", "content": mode}),
        );
        let t = Instant::now();
        let err = refused_as(
            e,
            "guest_copy_out",
            json!({"name": vm, "guest_path": "/tmp/evil", "host_path": e.dir.file("evil")}),
            kind,
        );
        eprintln!(
            "a hostile guest's {mode}: refused in {:?}: {err}",
            t.elapsed()
        );
        assert!(err.contains(says), "{mode}: {err}");
        assert_eq!(list_dir(out), vec!["secret.txt".to_string()]);
        assert_eq!(
            list_dir(e.dir.path()),
            before,
            "the failed copy left something behind"
        );
    }
    e.srv().call_ok(
        "guest_exec",
        json!({"name": vm, "command": "/bin/busybox",
        "args": ["mv", "/bin/sh.real", "/bin/sh"]}),
    );
    assert_eq!(e.guest_sh(vm, "echo restored"), "restored\n");
    // The endless writer still holds the port: the next copy frees it and works.
    e.guest_sh(vm, "echo after > /tmp/evil/after");
    let dest = e.dir.join("after");
    let r = call(
        e,
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/evil", "host_path": dest.to_str().unwrap()}),
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(
        std::fs::read_to_string(dest.join("after")).unwrap(),
        "after\n"
    );
}

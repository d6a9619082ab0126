//! sandbox_suspend and sandbox_resume: a sandbox saved to disk with its processes, memory and
//! devices, its QEMU ended (host memory freed), and brought back under the same name and
//! forwards in about the time of a clone. The save is a capture ([`crate::ops::sandbox::capture`]) into
//! `<state>/vms/NAME/suspended-T/` (the state folder: it survives a server restart and a host
//! reboot); the record keeps `suspended` until the resume, which maps that memory
//! copy-on-write as a clone maps a template's and loads the devices.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Map;

use crate::ops::error::OpError;
use crate::ops::guest::clock as guest_clock;
use crate::ops::sandbox::capture::{self, Plan, Then};
use crate::ops::sandbox::fork::{forkable, live};
use crate::ops::sandbox::frozen;
use crate::ops::session;
use crate::ops::vm::ends;
use crate::ops::vm::launch::{self, LaunchRequest};
use crate::ops::vm::records::{lookup, spec_of};
use crate::ops::work::Work;
use crate::qemu::{migrate, process, vm};
use crate::state::config::MemoryFile;
use crate::state::record::{text, Saved};
use crate::state::registry::{Record, RegistryError};

/// How long loading the saved state may take.
const LOAD_BUDGET: Duration = Duration::from_secs(60);

crate::described! {
    /// What sandbox_suspend did (its result, in this order).
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Suspended {
        /// The sandbox.
        pub name: String,
        /// Always "suspended".
        pub status: &'static str,
        /// How long it took.
        pub suspend_ms: u64,
        /// The saved device state's size.
        pub state_bytes: u64,
        /// The guest memory's size on disk.
        pub ram_bytes: u64,
        /// Where it was saved.
        pub path: String,
        /// What went wrong but did not stop it.
        pub warnings: Vec<String>,
    }
}

/// sandbox_suspend: saves sandbox `name` to disk and ends its QEMU.
pub fn suspend(ctx: &dyn Work, name: &str) -> Result<Suspended, OpError> {
    let started = Instant::now();
    let rec = lookup(name)?;
    if rec.suspended.is_some() {
        return Err(OpError::invalid(format!(
            "VM {name:?} is already suspended; sandbox_resume brings it back"
        )));
    }
    let spec = forkable(name, &rec)?;
    let dest = vm::state_dir(name).join(format!("suspended-{}", crate::clock::now_secs()));
    std::fs::create_dir_all(&dest)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", dest.display())))?;
    let plan = Plan {
        name,
        rec: &rec,
        spec: &spec,
        dest: &dest,
        then: Then::Quit,
        next_overlay: None,
    };
    let captured = match capture::capture(ctx, &plan) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dest);
            return Err(e);
        }
    };
    end_qemu(&rec);
    let mut warnings: Vec<String> = vm::cleanup_runtime(&rec);
    let saved = Saved {
        dir: Some(dest.display().to_string()),
        at: Some(crate::clock::now_secs()),
        state_bytes: Some(captured.state_bytes),
        ram_bytes: Some(captured.ram_bytes),
        memory_id: Some(captured.memory_id.clone()),
        was_running: Some(captured.was_running),
        other: Map::new(),
    };
    let n = name.to_string();
    crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get_mut(&n) {
            r.pid = None;
            r.suspended = Some(saved);
            if let Some(sb) = r.sandbox.as_mut() {
                sb.frozen = None;
            }
        }
        Ok::<_, RegistryError>(())
    })?;
    if let Some(old) = resumed_from(&rec).filter(|o| *o != dest) {
        let _ = std::fs::remove_dir_all(old);
    }
    warnings.extend(frozen::collect());
    Ok(Suspended {
        name: name.to_string(),
        status: "suspended",
        suspend_ms: started.elapsed().as_millis() as u64,
        state_bytes: captured.state_bytes,
        ram_bytes: captured.ram_bytes,
        path: dest.display().to_string(),
        warnings,
    })
}

/// Brings back sandbox `name` when its lifetime suspended it for idleness (a tool names it
/// again); anything else is left as it is. Costs the resume (about a clone's ready time).
pub fn wake_if_idle(ctx: &dyn Work, name: &str) -> Result<(), OpError> {
    let load = || crate::state::registry::shared().load().remove(name);
    let Some(mut rec) = load() else {
        return Ok(());
    };
    // A call that comes while the watcher ends the VM waits for that end (a suspend takes a
    // second or so), then finds it suspended and brings it back.
    let waited = Instant::now();
    while watcher_ending(&rec) && waited.elapsed() < Duration::from_secs(30) {
        if waited.elapsed() < Duration::from_millis(100) {
            ctx.progress_phase(&format!(
                "waiting for sandbox {name}'s idle end to finish, to bring it back"
            ));
        }
        ctx.check_cancel()?;
        std::thread::sleep(Duration::from_millis(100));
        match load() {
            Some(r) => rec = r,
            None => return Ok(()),
        }
    }
    let idle = rec.end.as_ref().and_then(|e| e.reason.as_deref()) == Some(ends::IDLE);
    if rec.suspended.is_none() || !idle {
        return Ok(());
    }
    let now = crate::clock::now_secs();
    if let Some(d) = rec
        .lifetime
        .as_ref()
        .and_then(|l| l.deadline)
        .filter(|d| *d <= now)
    {
        return Err(OpError::invalid(format!(
            "sandbox {name:?} was suspended when idle, and its deadline passed at {} while it \
             slept: it is not brought back by itself. vm_lifetime {{\"name\": {name:?}, \
             \"ttl_s\": N}} gives it a new one, then sandbox_resume",
            crate::clock::iso8601(d)
        )));
    }
    ctx.progress_phase(&format!(
        "resuming sandbox {name}, suspended when it was idle"
    ));
    let r = match resume(ctx, name, Duration::from_secs(90)) {
        Ok(r) => r,
        // Another call brought it back first.
        Err(_) if lookup(name).is_ok_and(|r| r.suspended.is_none()) => return Ok(()),
        Err(e) => {
            return Err(OpError::host(format!(
                "sandbox {name:?} was suspended when idle and could not be resumed: {}",
                e.msg
            )))
        }
    };
    ctx.log(
        "notice",
        &format!(
            "sandbox {name} was suspended when idle; resumed in {} ms",
            r.resume_ms
        ),
    );
    Ok(())
}

/// True while the lifetime watcher is ending VM `rec` (its fresh intent, not yet its end).
fn watcher_ending(rec: &Record) -> bool {
    rec.ending.as_ref().is_some_and(|e| {
        e.tool.as_deref() == Some("watcher")
            && e.at.is_some_and(|at| crate::clock::now_secs() - at < 60)
    })
}

/// Makes sure the captured VM's QEMU is gone (it was told to quit; SIGKILL after 10 s).
fn end_qemu(rec: &Record) {
    let Some(pid) = vm::pid(rec) else { return };
    if !process::wait_dead(pid, Duration::from_secs(10))
        && process::is_our_vm(pid, &vm::identity_socket(rec))
    {
        process::signal(pid, libc::SIGKILL);
        process::wait_dead(pid, Duration::from_secs(5));
    }
}

/// The saved folder a resumed VM maps its memory from.
fn resumed_from(rec: &Record) -> Option<PathBuf> {
    text(&rec.resumed_from).map(PathBuf::from)
}

crate::described! {
    /// Where a resume's time went, in milliseconds.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct ResumeSteps {
        /// QEMU up with its monitor.
        pub qemu_start: f64,
        /// The saved devices loaded.
        pub state_load: f64,
        /// The agent's first answer.
        pub first_agent_answer: f64,
    }
}

crate::described! {
    /// What sandbox_resume started: the launch's result, then (in this order) these.
    #[derive(serde::Serialize)]
    pub struct Resumed {
        /// The launch, its status the resumed VM's.
        #[serde(flatten)]
        pub launched: launch::Launched,
        /// Whether the agent answered.
        pub agent_ready: bool,
        /// Where the time went.
        pub steps_ms: ResumeSteps,
        /// How long it took.
        pub resume_ms: u64,
    }
}

/// sandbox_resume: brings suspended sandbox `name` back, its agent awaited within `wait`.
pub fn resume(ctx: &dyn Work, name: &str, wait: Duration) -> Result<Resumed, OpError> {
    let started = Instant::now();
    let rec = lookup(name)?;
    let Some(saved) = rec.suspended.clone() else {
        live(name, &rec)?;
        return Err(OpError::invalid(format!(
            "VM {name:?} is not suspended (it is running); sandbox_suspend suspends it"
        )));
    };
    let dir = saved.dir.map(PathBuf::from).unwrap_or_default();
    if !dir.join("ram").is_file() || !dir.join("state").is_file() {
        return Err(OpError::host(format!(
            "the saved state of {name:?} in {} is incomplete (its ram or state file is \
             missing); sandbox_destroy removes it",
            dir.display()
        )));
    }
    let mut spec = spec_of(name, &rec)?;
    spec.compute.memory_file = Some(MemoryFile {
        path: dir.join("ram"),
        shared: false,
    });
    spec.compute.memory_id = saved.memory_id;
    spec.start.incoming = true;
    spec.start.start_paused = false;
    let lr = LaunchRequest {
        spec,
        extra_record: carried(&rec, &dir),
        accel_note: None,
        kvm_fallback: false,
        cloud_init: None,
        uefi_vars_from: None,
        egress: crate::ops::vm::egress::rules_from(&rec)?,
        secrets: Vec::new(),
        // The resumed guest holds its placeholders: its new proxy swaps the same ones.
        kept_secrets: crate::ops::vm::egress::secrets_of(&rec),
    };
    let t_launch = Instant::now();
    let launched = launch::launch(ctx, lr).inspect_err(|_| put_back(name, &rec))?;
    let qemu_ms = t_launch.elapsed();
    let t_load = Instant::now();
    let paused = saved.was_running == Some(false);
    load(name, &dir, paused).inspect_err(|_| {
        if let Some(pid) = launched.pid {
            process::signal(pid, libc::SIGKILL);
        }
        put_back(name, &rec);
    })?;
    let load_ms = t_load.elapsed();
    let t_agent = Instant::now();
    let agent = match (&launched.qga_socket, paused) {
        (_, true) => Err("the sandbox was paused when suspended; resume_vm lets it run".into()),
        // Ready when the agent answers, as a clone is: the clock is set on that same agent
        // session in the background, so the first guest call waits for it (~70-100 ms of
        // hwclock) and sees the host's time.
        (sock, false) => guest_clock::answer_then_set(Path::new(sock), wait, None).map(drop),
    };
    let ms = |d: Duration| (d.as_secs_f64() * 10000.0).round() / 10.0;
    let mut launched = launched;
    launched.status = if paused { "paused" } else { "running" }.to_string();
    let agent_ready = agent.is_ok();
    if let Err(why) = agent {
        launched.warnings.push(why);
    }
    crate::ops::vm::lifetime::touch(name);
    Ok(Resumed {
        launched,
        agent_ready,
        steps_ms: ResumeSteps {
            qemu_start: ms(qemu_ms),
            state_load: ms(load_ms),
            first_agent_answer: ms(t_agent.elapsed()),
        },
        resume_ms: started.elapsed().as_millis() as u64,
    })
}

/// The suspended record's own fields (its sandbox among them), for the resumed record.
fn carried(rec: &Record, dir: &Path) -> Record {
    // The launch writes its own identity, spec and running QEMU's facts over these; what
    // described the ended QEMU alone goes.
    let mut r = Record {
        suspended: None,
        launching: None,
        launch_qmp_socket: None,
        ..rec.clone()
    };
    r.resumed_from = Some(dir.display().to_string());
    crate::ops::vm::lifetime::running_again(&mut r, crate::clock::now_secs());
    r
}

/// Loads the saved devices into the waiting QEMU (which then runs, unless it was paused).
fn load(name: &str, dir: &Path, paused: bool) -> Result<(), OpError> {
    let rec = lookup(name)?;
    session::monitor(name, &rec, |q| {
        migrate::load(q, &dir.join("state"), Instant::now() + LOAD_BUDGET)?;
        if paused {
            q.stop_vcpus()?;
        }
        Ok(())
    })
    .map_err(|e| {
        OpError::host(format!(
            "{name:?} could not load its saved state ({}); it stays suspended",
            e.msg
        ))
    })
}

/// Writes the suspended record back after a resume that failed.
fn put_back(name: &str, rec: &Record) {
    let (n, r) = (name.to_string(), rec.clone());
    let _ = crate::state::registry::shared().update(move |vms| {
        vms.insert(n, r);
        Ok::<_, RegistryError>(())
    });
}

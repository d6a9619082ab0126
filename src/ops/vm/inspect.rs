//! What a VM is now (list_vms, vm_info): its record with its status measured, never
//! remembered, within a budget (a wedged QEMU is reported, not waited for), and what QMP says
//! of a running one (run state, vCPUs, accelerator, memory, block devices).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ops::error::OpError;
use crate::ops::session::explain_qmp;
use crate::ops::vm::egress::EgressInfo;
use crate::ops::vm::ends;
use crate::ops::vm::hold::{self, Held};
use crate::ops::vm::lifetime::{self, Shown};
use crate::ops::vm::metrics::{self, Metrics};
use crate::ops::vm::records::lookup;
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::qmp_calls::{BlockInfo, RunState};
use crate::qemu::vm::{self, Measured, Status};
use crate::state::record::{End, Forward, Record, Sandbox};
use crate::state::registry::Vms;

/// What a running QEMU cannot change (vCPUs are never hot-plugged by mcqemu).
#[derive(Clone, Debug)]
struct StaticFacts {
    vcpus: Option<usize>,
    accel: &'static str,
    memory_mb: Option<u64>,
    version: String,
}

/// Static facts per QEMU, keyed by its QMP socket and PID.
type FactsCache = std::sync::Mutex<HashMap<(PathBuf, Option<i32>), StaticFacts>>;

/// Static facts, asked once per server process.
fn static_facts() -> &'static FactsCache {
    static FACTS: OnceLock<FactsCache> = OnceLock::new();
    FACTS.get_or_init(Default::default)
}

/// How long vm_info may spend on QMP: a wedged QEMU is reported, not waited for.
const INFO_BUDGET: Duration = Duration::from_millis(4500);

crate::described! {
    /// One VM as list_vms shows it (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Listed {
        /// The VM.
        pub name: String,
        /// Its measured status.
        pub status: Status,
        /// spawned, attached, sandbox, ...
        pub source: String,
        /// Its guest architecture.
        pub arch: Option<String>,
        /// Its accelerator.
        pub accel: Option<String>,
        /// Its QEMU's process.
        pub pid: Option<i64>,
        /// When it was launched.
        pub created_at: Option<String>,
        /// Its memory.
        pub memory_mb: Option<u64>,
        /// Its vCPUs.
        pub cpus: Option<u64>,
        /// Its monitor.
        pub qmp_socket: Option<String>,
        /// Its serial log.
        pub serial_log: Option<String>,
        /// Its host forwards.
        pub port_forwards: Option<Vec<Forward>>,
        /// Its sandbox facts.
        pub sandbox: Option<Sandbox>,
        /// Why its status is what it is, when that needs saying.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub detail: Option<String>,
        /// A person's hold.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub held: Option<Held>,
        /// When it ends by itself, and its idle clock.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub lifetime: Option<Shown>,
        /// Why it ended (a VM not running): reason (asked, ttl, idle, guest_poweroff, crashed,
        /// oom, killed, unknown), tool (what asked), detail, at, exit_code, signal.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub end: Option<End>,
        /// What it uses now (a running VM), or its disk (one that is not).
        pub metrics: Metrics,
    }
}

crate::described! {
    /// list_vms's result.
    #[derive(Debug, Clone, Serialize)]
    pub struct VmList {
        /// Every VM but pooled clones.
        pub vms: Vec<Listed>,
        /// Records skipped or a registry file quarantined, said once.
        pub registry_warnings: Vec<String>,
    }
}

/// How long list_vms may spend measuring, for all VMs together.
const LIST_BUDGET: Duration = Duration::from_millis(900);

/// Measures every VM at once, each within the list's budget: a VM settled by its record or
/// process costs nothing; the others are asked over QMP in parallel, and one that has not
/// answered when the budget runs out is reported `unresponsive` instead of holding up the rest.
fn measure_all(vms: &Vms) -> BTreeMap<String, (Measured, Option<(u64, u64)>)> {
    let deadline = Instant::now() + LIST_BUDGET;
    let mut out = BTreeMap::new();
    let (tx, rx) = mpsc::channel();
    let mut asked = 0;
    for (name, rec) in vms {
        if let Some(m) = vm::measure_process(rec).or_else(|| vm::measure_gone(rec)) {
            out.insert(name.clone(), (m, None));
            continue;
        }
        let (tx, name, rec) = (tx.clone(), name.clone(), rec.clone());
        let probe = std::thread::Builder::new()
            .name("list-probe".into())
            .spawn(move || {
                let m = vm::measure_with_io(
                    &rec,
                    LIST_BUDGET.saturating_sub(Duration::from_millis(50)),
                );
                let _ = tx.send((name, m));
            });
        if probe.is_ok() {
            asked += 1;
        }
    }
    drop(tx);
    for _ in 0..asked {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((name, m)) => {
                out.insert(name, m);
            }
            Err(_) => break,
        }
    }
    for name in vms.keys() {
        out.entry(name.clone()).or_insert_with(|| {
            let m = Measured {
                status: Status::Unresponsive,
                detail: Some(format!(
                    "did not answer within {} ms; vm_info waits longer, stop_vm with \
                     force=true ends it",
                    LIST_BUDGET.as_millis()
                )),
            };
            (m, None)
        });
    }
    out
}

/// Every registered VM (pooled clones aside: template_list counts them), measured now.
pub fn list() -> VmList {
    let reg = crate::state::registry::shared();
    let vms = reg.load();
    let mut measured = measure_all(&vms);
    // One look at the host's connections serves every VM's forwards.
    let ports: Vec<u16> = vms
        .values()
        .filter(|r| r.lifetime.is_some())
        .flat_map(lifetime::forward_ports)
        .collect();
    let tcp = crate::host::tcp_diag::last_data_by_port(&ports).unwrap_or_default();
    let list = vms
        .iter()
        .filter(|(_, rec)| rec.pooled.is_none())
        .map(|(name, rec)| {
            let (m, io) = measured.remove(name).unwrap_or((
                Measured {
                    status: Status::Unresponsive,
                    detail: None,
                },
                None,
            ));
            listed(name, rec, m, io, &tcp)
        })
        .collect();
    VmList {
        vms: list,
        registry_warnings: reg.take_warnings(),
    }
}

/// One VM as list_vms shows it, measured now within list_vms's budget (the metrics resource).
pub fn one(name: &str) -> Result<Listed, OpError> {
    let rec = lookup(name)?;
    let (m, io) = vm::measure_with_io(&rec, LIST_BUDGET);
    let tcp = crate::host::tcp_diag::last_data_by_port(&lifetime::forward_ports(&rec))
        .unwrap_or_default();
    let mut one = listed(name, &rec, m, io, &tcp);
    let running = one.status.clone();
    one.metrics = metrics::with_pss(
        one.metrics,
        &rec,
        !matches!(running, Status::Stopped | Status::Suspended),
    );
    Ok(one)
}

/// A record with its measured status (and disk counters) in list_vms's shape.
fn listed(
    name: &str,
    rec: &Record,
    m: Measured,
    io: Option<(u64, u64)>,
    tcp: &HashMap<u16, Duration>,
) -> Listed {
    let running = m.alive();
    Listed {
        lifetime: lifetime::shown(name, rec, running, Some(tcp)),
        end: ends::shown(rec, running),
        metrics: metrics::of(name, rec, running, io),
        name: name.to_string(),
        status: m.status,
        source: rec.source.clone().unwrap_or_else(|| "spawned".into()),
        arch: rec.arch(),
        accel: rec.accel.clone(),
        pid: rec.pid,
        created_at: rec.created_at.clone(),
        memory_mb: rec.memory_mb(),
        cpus: rec.cpus(),
        qmp_socket: rec.qmp_socket.clone(),
        serial_log: rec.serial_log.clone(),
        port_forwards: Some(rec.forwards()),
        sandbox: rec.sandbox.clone(),
        detail: m.detail,
        held: hold::of(rec),
    }
}

/// A token that changes whenever VM `name`'s metrics may have (for the metrics resource's
/// subscribers): every 2 s while its QEMU runs, at its end once it does not; None for no such
/// VM.
pub fn metrics_version(name: &str) -> Option<String> {
    let rec = crate::state::registry::shared().load().remove(name)?;
    Some(match vm::measure_process(&rec) {
        Some(m) if !m.alive() => format!(
            "{}:{}",
            m.status,
            rec.end.as_ref().and_then(|e| e.at).unwrap_or(0)
        ),
        _ => format!("running:{}", crate::clock::now_secs() / 2),
    })
}

crate::described! {
    /// A block device holding a medium, as vm_info shows it.
    #[derive(Debug, Clone, Serialize)]
    pub struct BlockDevice {
        /// QEMU's device name.
        pub device: Option<String>,
        /// Its qdev path.
        pub qdev: Option<String>,
        /// The image file.
        pub file: Option<String>,
        /// Its format driver.
        pub format: Option<String>,
        /// Read-only.
        pub read_only: Option<bool>,
    }
}

crate::described! {
    /// vm_info's result (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct VmInfo {
        /// The VM.
        pub name: String,
        /// Its status (QEMU's run state when its monitor answered).
        pub status: String,
        /// Its registry record, as it is.
        pub record: Record,
        /// Its host forwards.
        pub port_forwards: Vec<Forward>,
        /// Its background processes.
        pub background: Vec<BackgroundListed>,
        /// Block devices with a medium.
        pub block_devices: Vec<BlockDevice>,
        /// vCPUs, from QMP.
        pub vcpus: Option<usize>,
        /// Memory, from QMP.
        pub memory_mb: Option<u64>,
        /// The accelerator in use.
        pub accel: Option<String>,
        /// QEMU's version.
        pub qemu_version: Option<String>,
        /// The seccomp mode the kernel enforces on its QEMU.
        pub seccomp: Option<&'static str>,
        /// A person's hold.
        pub held: Option<Held>,
        /// Its egress proxy's state.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub egress_proxy: Option<&'static str>,
        /// Its egress rules and counts.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub egress: Option<EgressInfo>,
        /// Host folders mounted into it, and how each stands.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub mounts: Vec<crate::ops::vm::mounts::Shown>,
        /// When it ends by itself, and its idle clock.
        pub lifetime: Option<Shown>,
        /// Why it ended (a VM not running): reason (asked, ttl, idle, guest_poweroff, crashed,
        /// oom, killed, unknown), tool (what asked), detail, at, exit_code, signal.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub end: Option<End>,
        /// What it uses.
        pub metrics: Metrics,
        /// Why its status is what it is, when that needs saying.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub detail: Option<String>,
    }
}

/// VM `name`'s record and what one QMP session says of it, within [`INFO_BUDGET`].
pub fn info(name: &str) -> Result<VmInfo, OpError> {
    let rec = lookup(name)?;
    // One QMP session answers everything; only when the process already settles the status
    // (or the session fails) is the status measured separately.
    let settled = vm::measure_process(&rec);
    let egress = crate::ops::vm::egress::info(name, &rec);
    let mut out = VmInfo {
        name: name.to_string(),
        status: settled
            .as_ref()
            .map_or(Status::Running, |m| m.status.clone())
            .to_string(),
        port_forwards: vm::forwards(&rec),
        background: background_list(&rec),
        block_devices: Vec::new(),
        vcpus: None,
        memory_mb: None,
        accel: rec.accel.clone(),
        qemu_version: rec.qemu_version.clone(),
        seccomp: vm::pid(&rec).and_then(crate::qemu::process::seccomp),
        held: hold::of(&rec),
        egress_proxy: egress.as_ref().map(|e| e.egress_proxy),
        egress,
        mounts: crate::ops::vm::mounts::shown(name, &rec),
        lifetime: None,
        end: None,
        metrics: Metrics::default(),
        detail: None,
        record: rec,
    };
    if let Some(m) = settled {
        let running = m.alive();
        out.detail = m.detail;
        out.lifetime = lifetime::shown(name, &out.record, running, None);
        out.end = ends::shown(&out.record, running);
        out.metrics = metrics::of(name, &out.record, running, None);
        return Ok(out);
    }
    out.lifetime = lifetime::shown(name, &out.record, true, None);
    match ask_live(&out.record) {
        Ok((status, block, facts, io)) => {
            out.metrics =
                metrics::with_pss(metrics::of(name, &out.record, true, io), &out.record, true);
            if status.status == "running" {
                out.metrics.guest_memory = guest_memory(&out.record);
            }
            out.status = status.status;
            out.vcpus = facts.vcpus;
            out.accel = Some(facts.accel.to_string());
            out.qemu_version = Some(facts.version);
            out.memory_mb = facts.memory_mb;
            out.block_devices = block_devices(block);
        }
        Err(e) => {
            // The session failed: say why without another wait (busy, unresponsive, exited).
            let rec = &out.record;
            let m = match vm::measure_process(rec) {
                Some(settled) => settled,
                None => vm::classify(rec, &e, INFO_BUDGET),
            };
            let running = m.alive();
            out.status = m.status.to_string();
            out.detail = Some(m.detail.unwrap_or_else(|| explain_qmp(name, rec, &e)));
            out.end = ends::shown(rec, running);
            out.metrics = metrics::with_pss(metrics::of(name, rec, running, None), rec, running);
        }
    }
    Ok(out)
}

/// How long vm_info gives the guest agent for /proc/meminfo.
const MEMINFO_BUDGET: Duration = Duration::from_millis(1500);

/// The guest's memory from its /proc/meminfo, through its agent, when the agent is known to
/// answer this QEMU (an agent session synced since it started, and none failed since) and no
/// other call of this server is using it. A VM with no answering agent is never waited for.
fn guest_memory(rec: &Record) -> Option<metrics::GuestMemory> {
    use crate::qemu::agent_calls::{file_close, file_open, file_read};
    let sock = crate::state::record::text(&rec.qga_socket)?;
    if !crate::qemu::agent_seen::known(std::path::Path::new(sock)) {
        return None;
    }
    let text = crate::qemu::qga::try_with_agent(
        std::path::Path::new(sock),
        MEMINFO_BUDGET,
        |q| -> Result<Vec<u8>, crate::qemu::qga::QgaError> {
            let h = file_open(q, "/proc/meminfo", "r")?;
            let read = file_read(q, h, 16 * 1024);
            let _ = file_close(q, h, MEMINFO_BUDGET);
            Ok(read?.0)
        },
    )?
    .ok()?;
    metrics::guest_memory(&String::from_utf8_lossy(&text))
}

/// One QMP session within [`INFO_BUDGET`]: the run state, the block devices and the static
/// facts (asked once per QEMU process, then cached).
type Live = (RunState, Vec<BlockInfo>, StaticFacts, Option<(u64, u64)>);

fn ask_live(rec: &Record) -> Result<Live, QmpError> {
    let deadline = Instant::now() + INFO_BUDGET;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let sock = vm::qmp_socket(rec);
    let key = (sock.clone(), vm::pid(rec));
    let cached = static_facts()
        .lock()
        .ok()
        .and_then(|m| m.get(&key).cloned());
    let (status, block, facts, io) = qmp::with_session_within(&sock, INFO_BUDGET, |q| {
        // What cannot change while this QEMU runs is asked once per process; the rest goes
        // out in one pipelined round trip.
        let look = q.look(cached.is_none(), left())?;
        let facts = match (&cached, look.fixed) {
            (Some(f), _) => f.clone(),
            (None, Some(f)) => StaticFacts {
                vcpus: f.vcpus,
                accel: if f.kvm { "kvm" } else { "tcg" },
                memory_mb: f.memory_mb,
                version: q.version.clone(),
            },
            (None, None) => return Err(QmpError::Closed),
        };
        Ok::<_, QmpError>((look.status, look.block, facts, look.io))
    })?;
    if cached.is_none() {
        remember(key, &facts);
    }
    Ok((status, block, facts, io))
}

/// Caches one QEMU's static facts.
fn remember(key: (PathBuf, Option<i32>), facts: &StaticFacts) {
    if let Ok(mut m) = static_facts().lock() {
        // Bounded: entries of VMs long gone are dropped when the map grows.
        if m.len() > 1024 {
            m.clear();
        }
        m.insert(key, facts.clone());
    }
}

/// query-block's devices that hold a medium, in vm_info's shape.
fn block_devices(block: Vec<BlockInfo>) -> Vec<BlockDevice> {
    block
        .into_iter()
        .filter_map(|d| {
            let ins = d.inserted?;
            Some(BlockDevice {
                device: d.device,
                qdev: d.qdev,
                file: ins.file,
                format: ins.drv,
                read_only: Some(ins.ro),
            })
        })
        .collect()
}

/// The processes recorded for VM `name` (handle, pid, command, state), for vm_info.
fn background_list(rec: &Record) -> Vec<BackgroundListed> {
    let mut v: Vec<BackgroundListed> = rec
        .background
        .iter()
        .flatten()
        .map(|(h, p)| BackgroundListed {
            handle: h.clone(),
            pid: p.pid,
            command: p.command.clone(),
            started_at: p.started_at,
            running: p.ended.is_none(),
            exitcode: p.ended.as_ref().and_then(|e| e.exitcode),
            signal: p.ended.as_ref().and_then(|e| e.signal),
        })
        .collect();
    v.sort_by_key(|p| p.started_at.unwrap_or(0));
    v
}

crate::described! {
    /// A background process as vm_info lists it (in this order; `null` where the record has none).
    #[derive(Debug, Clone, Serialize)]
    pub struct BackgroundListed {
        /// Its handle.
        pub handle: String,
        /// Its guest PID.
        pub pid: Option<i64>,
        /// What was started.
        pub command: Option<String>,
        /// When (seconds since the epoch).
        pub started_at: Option<i64>,
        /// Not yet seen ending.
        pub running: bool,
        /// Its exit code, once ended.
        pub exitcode: Option<i64>,
        /// The signal that ended it.
        pub signal: Option<i64>,
    }
}

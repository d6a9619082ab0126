//! The QMP commands mcqemu sends, typed: their arguments built and the reply fields it reads
//! parsed here, so operations never spell a QMP name or a reply key. A reply that lacks a field
//! reads as its default (QEMU versions differ in what they add), never as a failure.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::qmp::{Qmp, QmpError, COMMAND_TIMEOUT};

/// `query-status`: the guest's run state.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RunState {
    /// `running`, `paused`, `inmigrate`, `postmigrate`, `shutdown`, ...
    #[serde(default = "unknown")]
    pub status: String,
    /// The vCPUs run.
    #[serde(default)]
    pub running: bool,
}

fn unknown() -> String {
    "unknown".into()
}

/// One entry of `query-block`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct BlockInfo {
    /// The device's name (empty for a `-blockdev` one).
    pub device: Option<String>,
    /// Its qdev path.
    pub qdev: Option<String>,
    /// The medium, when one is inserted.
    pub inserted: Option<Inserted>,
}

/// A medium in a block device.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Inserted {
    /// The image file.
    pub file: Option<String>,
    /// Its format driver.
    pub drv: Option<String>,
    /// Read-only.
    #[serde(default)]
    pub ro: bool,
    /// The top node's name.
    #[serde(rename = "node-name")]
    pub node_name: Option<String>,
    /// The image's own facts.
    pub image: Option<ImageInfo>,
}

/// What `query-block` says of an image.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ImageInfo {
    /// Its internal snapshots.
    #[serde(default)]
    pub snapshots: Vec<SnapshotInfo>,
}

/// An internal snapshot as QEMU lists it (QAPI's `SnapshotInfo`, which `qemu-img info` prints
/// too).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SnapshotInfo {
    /// QEMU's id.
    pub id: Option<String>,
    /// Its tag.
    pub name: Option<String>,
    /// Bytes of saved VM state.
    #[serde(rename = "vm-state-size", default)]
    pub vm_state_size: u64,
    /// When (seconds since the epoch).
    #[serde(rename = "date-sec")]
    pub date_sec: Option<i64>,
    /// The guest's clock then: seconds.
    #[serde(rename = "vm-clock-sec")]
    pub vm_clock_sec: Option<u64>,
    /// And nanoseconds.
    #[serde(rename = "vm-clock-nsec", default)]
    pub vm_clock_nsec: u64,
}

/// One entry of `query-jobs`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct JobInfo {
    /// The job's id.
    #[serde(default)]
    pub id: String,
    /// `running`, `concluded`, `null`, ...
    #[serde(default)]
    pub status: String,
    /// Why it failed, once concluded.
    pub error: Option<String>,
}

/// One entry of `query-machines`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct MachineInfo {
    /// The machine type.
    #[serde(default)]
    pub name: String,
    /// Its alias (`pc`, `q35`).
    pub alias: Option<String>,
    /// The RAM id it gives memory when no backend is named.
    #[serde(rename = "default-ram-id")]
    pub default_ram_id: Option<String>,
}

/// A snapshot job on a running VM's disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotJob {
    /// `snapshot-save`: the device state goes into the first node.
    Save,
    /// `snapshot-load`.
    Load,
    /// `snapshot-delete`.
    Delete,
}

impl SnapshotJob {
    /// The QMP command.
    pub fn command(self) -> &'static str {
        match self {
            SnapshotJob::Save => "snapshot-save",
            SnapshotJob::Load => "snapshot-load",
            SnapshotJob::Delete => "snapshot-delete",
        }
    }
}

/// One event of `input-send-event`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputEvent {
    /// A key (by QEMU's qcode) pressed or released.
    Key {
        /// The qcode.
        qcode: String,
        /// Pressed (true) or released.
        down: bool,
    },
    /// A mouse button (`left`, `right`, `middle`, `wheel-up`, ...) pressed or released.
    Btn {
        /// The button.
        button: String,
        /// Pressed (true) or released.
        down: bool,
    },
    /// An absolute pointer position on one axis (0..=32767 across the screen).
    Abs {
        /// The axis.
        axis: Axis,
        /// The position.
        value: i64,
    },
    /// Relative motion on one axis.
    Rel {
        /// The axis.
        axis: Axis,
        /// The distance.
        value: i64,
    },
}

/// A pointer axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Across.
    X,
    /// Down.
    Y,
}

impl InputEvent {
    /// Pressed or released, for keys and buttons.
    pub fn down(&self) -> Option<bool> {
        match self {
            InputEvent::Key { down, .. } | InputEvent::Btn { down, .. } => Some(*down),
            InputEvent::Abs { .. } | InputEvent::Rel { .. } => None,
        }
    }

    /// The event as QMP takes it.
    pub fn wire(&self) -> Value {
        let axis = |a: &Axis| match a {
            Axis::X => "x",
            Axis::Y => "y",
        };
        match self {
            InputEvent::Key { qcode, down } => json!({"type": "key",
                "data": {"down": down, "key": {"type": "qcode", "data": qcode}}}),
            InputEvent::Btn { button, down } => {
                json!({"type": "btn", "data": {"down": down, "button": button}})
            }
            InputEvent::Abs { axis: a, value } => {
                json!({"type": "abs", "data": {"axis": axis(a), "value": value}})
            }
            InputEvent::Rel { axis: a, value } => {
                json!({"type": "rel", "data": {"axis": axis(a), "value": value}})
            }
        }
    }
}

/// What one pipelined round trip tells of a running VM (vm_info).
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    /// Its run state.
    pub status: RunState,
    /// Its block devices.
    pub block: Vec<BlockInfo>,
    /// What cannot change while this QEMU runs, when asked.
    pub fixed: Option<Fixed>,
    /// Bytes the guest read from and wrote to its disks (query-blockstats), when known.
    pub io: Option<(u64, u64)>,
}

/// Bytes read and written over every device of a query-blockstats reply.
pub fn disk_io(stats: &Value) -> Option<(u64, u64)> {
    let devices = stats.as_array()?;
    let sum = |k: &str| {
        devices
            .iter()
            .filter_map(|d| d.get("stats")?.get(k)?.as_u64())
            .sum::<u64>()
    };
    Some((sum("rd_bytes"), sum("wr_bytes")))
}

/// What cannot change while a QEMU runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Fixed {
    /// Its vCPUs.
    pub vcpus: Option<usize>,
    /// It runs under KVM.
    pub kvm: bool,
    /// Its base memory (None when QEMU cannot say).
    pub memory_mb: Option<u64>,
}

/// A reply read as `T`, or a clear error naming the command.
pub fn reply<T: DeserializeOwned>(cmd: &str, v: Value) -> Result<T, QmpError> {
    T::deserialize(&v).map_err(|e| QmpError::Garbage(format!("{cmd} replied oddly: {e}")))
}

impl Qmp {
    /// The guest's run state.
    pub fn query_status(&mut self) -> Result<RunState, QmpError> {
        self.query_status_within(COMMAND_TIMEOUT)
    }

    /// The guest's run state, within `within`.
    pub fn query_status_within(&mut self, within: Duration) -> Result<RunState, QmpError> {
        reply(
            "query-status",
            self.execute_within("query-status", None, within)?,
        )
    }

    /// The host thread ids of the vCPUs when they run, in one pipelined round trip; None when
    /// the guest is paused or stopped (its vCPUs then take nothing, whatever the wait).
    pub fn running_vcpu_threads(&mut self) -> Result<Option<Vec<u32>>, QmpError> {
        #[derive(Deserialize)]
        struct Cpu {
            #[serde(rename = "thread-id")]
            thread_id: u32,
        }
        let cmds = [("query-status", None), ("query-cpus-fast", None)];
        let mut replies = self.execute_pipelined(&cmds, COMMAND_TIMEOUT)?.into_iter();
        let mut next = || replies.next().unwrap_or(Err(QmpError::Closed));
        let status: RunState = reply("query-status", next()?)?;
        let cpus: Vec<Cpu> = reply("query-cpus-fast", next()?)?;
        Ok(status
            .running
            .then(|| cpus.into_iter().map(|c| c.thread_id).collect()))
    }

    /// The run state and block devices, and with `fixed` the vCPUs, accelerator and memory,
    /// in one pipelined round trip within `within`.
    pub fn look(&mut self, fixed: bool, within: Duration) -> Result<Look, QmpError> {
        let mut cmds: Vec<(&str, Option<Value>)> = vec![
            ("query-status", None),
            ("query-block", None),
            ("query-blockstats", None),
        ];
        if fixed {
            cmds.extend([
                ("query-cpus-fast", None),
                ("query-kvm", None),
                ("query-memory-size-summary", None),
            ]);
        }
        let mut replies = self.execute_pipelined(&cmds, within)?.into_iter();
        let mut next = || replies.next().unwrap_or(Err(QmpError::Closed));
        let status = reply("query-status", next()?)?;
        let block = reply("query-block", next()?)?;
        let io = next().ok().as_ref().and_then(disk_io);
        let fixed = match fixed {
            false => None,
            true => {
                let cpus = next()?;
                let kvm = next()?;
                // The memory summary may fail: memory is then unknown.
                let mem = next().ok();
                Some(Fixed {
                    vcpus: cpus.as_array().map(Vec::len),
                    kvm: kvm.get("enabled").and_then(Value::as_bool) == Some(true),
                    memory_mb: mem
                        .as_ref()
                        .and_then(|m| m.get("base-memory"))
                        .and_then(Value::as_u64)
                        .map(|b| b / (1024 * 1024)),
                })
            }
        };
        Ok(Look {
            status,
            block,
            fixed,
            io,
        })
    }

    /// Lets the vCPUs run.
    pub fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", None).map(drop)
    }

    /// Stops the vCPUs.
    pub fn stop_vcpus(&mut self) -> Result<(), QmpError> {
        self.execute("stop", None).map(drop)
    }

    /// Asks the guest to power down (ACPI).
    pub fn system_powerdown(&mut self) -> Result<(), QmpError> {
        self.execute("system_powerdown", None).map(drop)
    }

    /// Asks QEMU to quit, within `within`.
    pub fn quit_within(&mut self, within: Duration) -> Result<(), QmpError> {
        self.execute_within("quit", None, within).map(drop)
    }

    /// Whether QEMU runs the guest under KVM.
    pub fn kvm_enabled(&mut self) -> Result<bool, QmpError> {
        let kvm = self.execute("query-kvm", None)?;
        Ok(kvm.get("enabled").and_then(Value::as_bool) == Some(true))
    }

    /// The block devices.
    pub fn query_block(&mut self) -> Result<Vec<BlockInfo>, QmpError> {
        reply("query-block", self.execute("query-block", None)?)
    }

    /// Starts snapshot job `job` as `job_id` for `tag` on block nodes `nodes` (the first
    /// holds the device state).
    pub fn start_snapshot_job(
        &mut self,
        job: SnapshotJob,
        job_id: &str,
        tag: &str,
        nodes: &[String],
    ) -> Result<(), QmpError> {
        let mut args = json!({"job-id": job_id, "tag": tag, "devices": nodes});
        if job != SnapshotJob::Delete {
            args["vmstate"] = json!(nodes.first());
        }
        self.execute(job.command(), Some(args)).map(drop)
    }

    /// The block jobs and other jobs.
    pub fn query_jobs(&mut self) -> Result<Vec<JobInfo>, QmpError> {
        reply("query-jobs", self.execute("query-jobs", None)?)
    }

    /// Cancels job `id`.
    pub fn job_cancel(&mut self, id: &str) -> Result<(), QmpError> {
        self.execute("job-cancel", Some(json!({"id": id})))
            .map(drop)
    }

    /// Dismisses concluded job `id`.
    pub fn job_dismiss(&mut self, id: &str) -> Result<(), QmpError> {
        self.execute("job-dismiss", Some(json!({"id": id})))
            .map(drop)
    }

    /// The machine types this QEMU has.
    pub fn query_machines(&mut self) -> Result<Vec<MachineInfo>, QmpError> {
        reply("query-machines", self.execute("query-machines", None)?)
    }

    /// The guest's VM generation id, when the machine has one.
    pub fn vm_generation_id(&mut self) -> Result<Option<String>, QmpError> {
        let r = self.execute("query-vm-generation-id", None)?;
        Ok(r.get("guid").and_then(Value::as_str).map(str::to_string))
    }

    /// Sends input events in one command.
    pub fn send_input(&mut self, events: &[InputEvent]) -> Result<(), QmpError> {
        let events: Vec<Value> = events.iter().map(InputEvent::wire).collect();
        self.execute("input-send-event", Some(json!({"events": events})))
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_the_fields_mcqemu_uses_and_default_the_rest() {
        let st: RunState = reply("query-status", json!({"status": "paused"})).unwrap();
        assert_eq!((st.status.as_str(), st.running), ("paused", false));
        let st: RunState = reply("query-status", json!({})).unwrap();
        assert_eq!(st.status, "unknown");
        let block: Vec<BlockInfo> = reply(
            "query-block",
            json!([{"device": "", "qdev": "/m/d", "inserted": {"file": "/a.qcow2", "drv": "qcow2",
                "ro": false, "node-name": "n1", "image": {"snapshots": [{"id": "1",
                "name": "t", "vm-state-size": 9, "date-sec": 5, "vm-clock-sec": 1,
                "vm-clock-nsec": 2}]}}}, {"device": "cd0"}]),
        )
        .unwrap();
        let ins = block[0].inserted.as_ref().unwrap();
        assert_eq!(ins.node_name.as_deref(), Some("n1"));
        let snap = &ins.image.as_ref().unwrap().snapshots[0];
        assert_eq!((snap.name.as_deref(), snap.vm_state_size), (Some("t"), 9));
        assert_eq!(snap.vm_clock_sec, Some(1));
        assert!(block[1].inserted.is_none());
        assert!(reply::<Vec<JobInfo>>("query-jobs", json!({"x": 1})).is_err());
    }

    #[test]
    fn input_events_are_qmp_s_own() {
        let key = InputEvent::Key {
            qcode: "a".into(),
            down: true,
        };
        assert_eq!(
            key.wire(),
            json!({"type": "key", "data": {"down": true, "key": {"type": "qcode", "data": "a"}}})
        );
        let abs = InputEvent::Abs {
            axis: Axis::Y,
            value: 7,
        };
        assert_eq!(
            abs.wire(),
            json!({"type": "abs", "data": {"axis": "y", "value": 7}})
        );
        assert_eq!((key.down(), abs.down()), (Some(true), None));
    }
}

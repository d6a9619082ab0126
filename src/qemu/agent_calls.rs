//! The guest agent's file and exec commands as mcqemu uses them, typed: what is sent, and the
//! reply fields read. The wire names (`capture-output`, `buf-b64`, ...) live here only.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::qga::{Qga, QgaError};
use crate::b64;

/// A file the agent opened (`guest-file-open`'s handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FileHandle(pub i64);

/// `guest-exec`'s arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecRequest {
    /// The program.
    pub path: String,
    /// Its arguments.
    pub arg: Vec<String>,
    /// Keep its stdout and stderr for `guest-exec-status`.
    #[serde(rename = "capture-output")]
    pub capture_output: bool,
    /// Its stdin, base64.
    #[serde(rename = "input-data", skip_serializing_if = "Option::is_none")]
    pub input_data: Option<String>,
    /// `K=V` entries (mcqemu-agent: added to its own environment with `env_merge`; qemu-ga
    /// would take them as the whole environment, so only ours is sent them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    /// mcqemu-agent: `env` is added to the agent's environment.
    #[serde(rename = "env-merge", skip_serializing_if = "Option::is_none")]
    pub env_merge: Option<bool>,
    /// mcqemu-agent: the program's working folder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// mcqemu-agent: a process group of its own (so `mcqemu-kill` reaches its children).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<bool>,
    /// mcqemu-agent: keep the last this many bytes of each stream (not the first 16 MiB).
    #[serde(rename = "keep-last", skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u64>,
    /// mcqemu-agent: run it as the container image's User (only a user's programs are).
    #[serde(rename = "as-image-user", skip_serializing_if = "Option::is_none")]
    pub as_image_user: Option<bool>,
}

impl ExecRequest {
    /// `path` with `arg`, its output captured, no stdin.
    pub fn captured(path: &str, arg: &[String]) -> ExecRequest {
        ExecRequest {
            path: path.to_string(),
            arg: arg.to_vec(),
            capture_output: true,
            input_data: None,
            env: None,
            env_merge: None,
            cwd: None,
            group: None,
            keep_last: None,
            as_image_user: None,
        }
    }
}

/// The version prefix of mcqemu's own agent (`guest-info`), which has the `mcqemu-*` commands.
pub const OUR_AGENT: &str = "mcqemu-agent";

/// `mcqemu-exec-output`'s reply: a running program's output from given offsets.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ExecOutput {
    /// The program ended (its status follows, and guest-exec-status collects it).
    #[serde(default)]
    pub exited: bool,
    /// Its stdout from the offset, base64.
    #[serde(rename = "out-data")]
    pub out_data: Option<String>,
    /// Its stderr from the offset, base64.
    #[serde(rename = "err-data")]
    pub err_data: Option<String>,
    /// The stdout offset after `out_data`.
    #[serde(rename = "out-next", default)]
    pub out_next: u64,
    /// The stderr offset after `err_data`.
    #[serde(rename = "err-next", default)]
    pub err_next: u64,
    /// The stdout offset of `out_data`'s first byte (older output was dropped).
    #[serde(rename = "out-start", default)]
    pub out_start: u64,
    /// The stderr offset of `err_data`'s first byte.
    #[serde(rename = "err-start", default)]
    pub err_start: u64,
    /// All the stdout written so far.
    #[serde(rename = "out-end", default)]
    pub out_end: u64,
    /// All the stderr written so far.
    #[serde(rename = "err-end", default)]
    pub err_end: u64,
    /// Its exit code, once exited.
    #[serde(default)]
    pub exitcode: Option<i64>,
    /// The signal that ended it.
    #[serde(default)]
    pub signal: Option<i64>,
}

/// mcqemu-agent's `mcqemu-exec-output`: the output of program `pid` past `offsets` (stdout,
/// stderr), waiting up to `wait` in the guest for some.
pub fn exec_output(
    q: &mut Qga,
    pid: i64,
    offsets: (u64, u64),
    wait: Duration,
) -> Result<ExecOutput, QgaError> {
    exec_output_capped(q, pid, offsets, wait, None)
}

/// [`exec_output`] with at most `max` bytes of each stream in the reply.
pub fn exec_output_capped(
    q: &mut Qga,
    pid: i64,
    offsets: (u64, u64),
    wait: Duration,
    max: Option<u64>,
) -> Result<ExecOutput, QgaError> {
    let mut args = json!({"pid": pid, "out-offset": offsets.0, "err-offset": offsets.1,
                      "wait-ms": wait.as_millis() as u64});
    if let Some(m) = max {
        args["max-bytes"] = json!(m);
    }
    let r = q.execute_within("mcqemu-exec-output", Some(args), wait + COMMAND_BOUND)?;
    ExecOutput::deserialize(&r)
        .map_err(|e| QgaError::Garbage(format!("mcqemu-exec-output replied {r}: {e}")))
}

/// mcqemu-agent's `mcqemu-kill`: `sig` to program `pid` (started by the agent) and its
/// group; false when it had already ended.
pub fn kill(q: &mut Qga, pid: i64, sig: i32) -> Result<bool, QgaError> {
    let r = q.execute_within(
        "mcqemu-kill",
        Some(json!({"pid": pid, "signal": sig})),
        COMMAND_BOUND,
    )?;
    Ok(r.get("signalled").and_then(Value::as_bool).unwrap_or(false))
}

/// One entry of `mcqemu-list-dir` (lstat's view: a link is not followed).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct DirEntry {
    /// Its name.
    pub name: String,
    /// st_mode: type and permission bits.
    pub mode: u32,
    /// Size in bytes.
    #[serde(default)]
    pub size: u64,
    /// Modification time, seconds since the epoch.
    #[serde(default)]
    pub mtime: i64,
}

/// `mcqemu-list-dir`'s reply.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct DirListing {
    /// The entries, sorted by name.
    #[serde(default)]
    pub entries: Vec<DirEntry>,
    /// There were more than asked for.
    #[serde(default)]
    pub truncated: bool,
}

/// mcqemu-agent's `mcqemu-list-dir`: folder `path`'s entries, at most `max`, read by the agent
/// itself (no shell or stat in the guest).
pub fn list_dir(q: &mut Qga, path: &str, max: usize) -> Result<DirListing, QgaError> {
    let r = q.execute_within(
        "mcqemu-list-dir",
        Some(json!({"path": path, "max": max})),
        LIST_BOUND,
    )?;
    DirListing::deserialize(&r)
        .map_err(|e| QgaError::Garbage(format!("mcqemu-list-dir replied {r}: {e}")))
}

/// Bound of a reply beyond a command's own wait in the guest.
const COMMAND_BOUND: Duration = Duration::from_secs(10);

/// Bound of a folder listing (up to 100,000 lstats in the guest, under TCG).
const LIST_BOUND: Duration = Duration::from_secs(60);

impl ExecOutput {
    /// Its new stdout and stderr, decoded.
    pub fn streams(&self) -> (Vec<u8>, Vec<u8>) {
        (decode(&self.out_data), decode(&self.err_data))
    }
}

/// `guest-exec-status`'s reply: the fields mcqemu reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ExecStatus {
    /// The program ended.
    #[serde(default)]
    pub exited: bool,
    /// Its exit code, when it exited normally.
    pub exitcode: Option<i64>,
    /// The signal that ended it.
    pub signal: Option<i64>,
    /// Its captured stdout, base64.
    #[serde(rename = "out-data")]
    pub out_data: Option<String>,
    /// Its captured stderr, base64.
    #[serde(rename = "err-data")]
    pub err_data: Option<String>,
    /// The agent cut its stdout.
    #[serde(rename = "out-truncated", default)]
    pub out_truncated: bool,
    /// The agent cut its stderr.
    #[serde(rename = "err-truncated", default)]
    pub err_truncated: bool,
}

impl ExecStatus {
    /// Its stdout, decoded (empty when none or not base64).
    pub fn stdout(&self) -> Vec<u8> {
        decode(&self.out_data)
    }

    /// Its stderr, decoded.
    pub fn stderr(&self) -> Vec<u8> {
        decode(&self.err_data)
    }
}

fn decode(data: &Option<String>) -> Vec<u8> {
    data.as_deref()
        .and_then(|d| b64::decode(d).ok())
        .unwrap_or_default()
}

/// `guest-ping`: the agent answers.
pub fn ping(q: &mut Qga, within: Duration) -> Result<(), QgaError> {
    q.execute_within("guest-ping", None, within).map(drop)
}

/// `guest-set-time` to `nanos` since the epoch.
pub fn set_time(q: &mut Qga, nanos: u64, within: Duration) -> Result<(), QgaError> {
    q.execute_within("guest-set-time", Some(json!({"time": nanos})), within)
        .map(drop)
}

/// What `guest-info` says: the agent's version and its commands.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GuestInfo {
    /// qemu-ga's version.
    #[serde(default)]
    pub version: String,
    /// Its commands, each enabled or blocked by the guest's configuration.
    #[serde(default)]
    pub supported_commands: Vec<GuestCommand>,
}

/// One agent command as `guest-info` lists it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GuestCommand {
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// The guest allows it.
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

/// `guest-info`.
pub fn info(q: &mut Qga, within: Duration) -> Result<GuestInfo, QgaError> {
    let r = q.execute_within("guest-info", None, within)?;
    GuestInfo::deserialize(&r)
        .map_err(|e| QgaError::Garbage(format!("guest-info replied {r}: {e}")))
}

/// `guest-get-osinfo`: the guest's own description of its OS, passed on as the agent gives it
/// (its fields vary by OS and agent version).
pub fn os_info(q: &mut Qga, within: Duration) -> Result<Value, QgaError> {
    q.execute_within("guest-get-osinfo", None, within)
}

/// Starts a program; its guest PID.
pub fn exec(q: &mut Qga, req: &ExecRequest, within: Duration) -> Result<i64, QgaError> {
    let args = serde_json::to_value(req).map_err(|e| QgaError::Garbage(e.to_string()))?;
    let r = q.execute_within("guest-exec", Some(args), within)?;
    r.get("pid")
        .and_then(Value::as_i64)
        .ok_or_else(|| QgaError::Garbage(format!("guest-exec returned no pid: {r}")))
}

/// A started program's status.
pub fn exec_status(q: &mut Qga, pid: i64, within: Duration) -> Result<ExecStatus, QgaError> {
    let r = q.execute_within("guest-exec-status", Some(json!({"pid": pid})), within)?;
    ExecStatus::deserialize(&r)
        .map_err(|e| QgaError::Garbage(format!("guest-exec-status replied {r}: {e}")))
}

/// Opens `path` in the guest with `mode` ("r", "w").
pub fn file_open(q: &mut Qga, path: &str, mode: &str) -> Result<FileHandle, QgaError> {
    let r = q.execute("guest-file-open", Some(json!({"path": path, "mode": mode})))?;
    r.as_i64()
        .map(FileHandle)
        .ok_or_else(|| QgaError::Garbage(format!("guest-file-open returned no handle: {r}")))
}

/// One read of up to `count` bytes: the bytes and whether the agent saw the end.
pub fn file_read(q: &mut Qga, h: FileHandle, count: usize) -> Result<(Vec<u8>, bool), QgaError> {
    let r = q.execute(
        "guest-file-read",
        Some(json!({"handle": h, "count": count})),
    )?;
    let chunk = r
        .get("buf-b64")
        .and_then(Value::as_str)
        .map(b64::decode)
        .transpose()
        .map_err(|e| QgaError::Garbage(format!("the agent sent bad base64: {e}")))?
        .unwrap_or_default();
    Ok((
        chunk,
        r.get("eof").and_then(Value::as_bool).unwrap_or(false),
    ))
}

/// One write of `bytes`; how many the guest took.
pub fn file_write(q: &mut Qga, h: FileHandle, bytes: &[u8]) -> Result<u64, QgaError> {
    let args = json!({"handle": h, "buf-b64": b64::encode(bytes)});
    let r = q.execute("guest-file-write", Some(args))?;
    Ok(r.get("count").and_then(Value::as_u64).unwrap_or(0))
}

/// Where a seek's offset counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    /// The file's start.
    Set,
    /// The file's end.
    End,
}

/// Moves a handle's position; the new position.
pub fn file_seek(q: &mut Qga, h: FileHandle, offset: i64, whence: Whence) -> Result<u64, QgaError> {
    let whence = match whence {
        Whence::Set => "set",
        Whence::End => "end",
    };
    let r = q.execute(
        "guest-file-seek",
        Some(json!({"handle": h, "offset": offset, "whence": whence})),
    )?;
    Ok(r.get("position").and_then(Value::as_u64).unwrap_or(0))
}

/// Closes a handle (its failure is returned for writers to check).
pub fn file_close(q: &mut Qga, h: FileHandle, within: Duration) -> Result<(), QgaError> {
    q.execute_within("guest-file-close", Some(json!({"handle": h})), within)
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_use_the_agent_s_names() {
        let mut r = ExecRequest::captured("ls", &["-l".to_string()]);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"path": "ls", "arg": ["-l"], "capture-output": true})
        );
        r.input_data = Some("aGk=".into());
        assert_eq!(serde_json::to_value(&r).unwrap()["input-data"], "aGk=");
        let s: ExecStatus = serde_json::from_value(json!({
            "exited": true, "exitcode": 3, "out-data": "aGk=", "out-truncated": true
        }))
        .unwrap();
        assert_eq!((s.exited, s.exitcode, s.signal), (true, Some(3), None));
        assert_eq!(s.stdout(), b"hi");
        assert!(s.out_truncated && !s.err_truncated && s.stderr().is_empty());
        let running: ExecStatus = serde_json::from_value(json!({"exited": false})).unwrap();
        assert!(!running.exited);
    }
}

//! The commands the agent answers, by qemu-ga's names and in its reply shapes, plus
//! mcqemu's own (`mcqemu-*`, listed in `guest-info`, which is how the host finds them).
//! Every argument is checked before use; a bad one is qemu-ga's GenericError with a reason.

use std::time::Duration;

use super::exec::{self, Start, Table};
use super::files::{Files, Whence};
use super::json::Json;
use super::output::MAX_OUTPUT;
use super::system::{self, Mode};
use crate::b64;

/// The version `guest-info` gives (the host tells this agent from qemu-ga by its prefix).
pub const VERSION: &str = concat!("mcqemu-agent ", env!("CARGO_PKG_VERSION"));

/// Every command, with whether it answers (qemu-ga's `success-response`).
pub const COMMANDS: &[(&str, bool)] = &[
    ("guest-sync-delimited", true),
    ("guest-sync", true),
    ("guest-ping", true),
    ("guest-info", true),
    ("guest-exec", true),
    ("guest-exec-status", true),
    ("guest-file-open", true),
    ("guest-file-read", true),
    ("guest-file-write", true),
    ("guest-file-seek", true),
    ("guest-file-close", true),
    ("guest-set-time", true),
    ("guest-get-time", true),
    ("guest-get-osinfo", true),
    ("guest-shutdown", false),
    ("mcqemu-exec-output", true),
    ("mcqemu-list-dir", true),
    ("mcqemu-kill", true),
];

/// What the agent holds between requests.
#[derive(Debug)]
pub struct Agent {
    /// The programs started.
    pub programs: Table,
    /// The files open.
    pub files: Files,
    /// Running as the guest's init.
    pub is_init: bool,
}

/// What the serving loop does after a request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Send this (one line; `delimited`: 0xFF before it).
    Reply {
        /// The reply.
        json: Json,
        /// guest-sync-delimited's 0xFF first.
        delimited: bool,
    },
    /// Nothing to send (guest-shutdown's way), then end the machine.
    Shutdown(Mode),
}

fn ret(v: Json) -> Outcome {
    Outcome::Reply {
        json: Json::obj([("return", v)]),
        delimited: false,
    }
}

/// qemu-ga's error reply.
pub fn error(class: &str, desc: impl Into<String>) -> Json {
    Json::obj([(
        "error",
        Json::obj([("class", Json::str(class)), ("desc", Json::str(desc))]),
    )])
}

fn generic(desc: impl Into<String>) -> Outcome {
    Outcome::Reply {
        json: error("GenericError", desc),
        delimited: false,
    }
}

/// The arguments of a request, read defensively.
struct Args<'a>(Option<&'a Json>);

impl<'a> Args<'a> {
    fn get(&self, k: &str) -> Option<&'a Json> {
        self.0.and_then(|a| a.get(k)).filter(|v| **v != Json::Null)
    }

    fn str(&self, k: &str) -> Result<&'a str, String> {
        self.opt_str(k)?
            .ok_or_else(|| format!("Parameter '{k}' is missing"))
    }

    fn opt_str(&self, k: &str) -> Result<Option<&'a str>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| format!("Invalid parameter type for '{k}', expected: string")),
        }
    }

    fn int(&self, k: &str) -> Result<i64, String> {
        self.opt_int(k)?
            .ok_or_else(|| format!("Parameter '{k}' is missing"))
    }

    fn opt_int(&self, k: &str) -> Result<Option<i64>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| format!("Invalid parameter type for '{k}', expected: integer")),
        }
    }

    fn opt_bool(&self, k: &str) -> Result<Option<bool>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| format!("Invalid parameter type for '{k}', expected: boolean")),
        }
    }

    fn opt_strings(&self, k: &str) -> Result<Option<Vec<String>>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect())
                .map(Some)
                .ok_or_else(|| {
                    format!("Invalid parameter type for '{k}', expected: array of strings")
                }),
        }
    }

    fn base64(&self, k: &str) -> Result<Option<Vec<u8>>, String> {
        self.opt_str(k)?
            .map(|t| b64::decode(t).map_err(|_| format!("Invalid parameter '{k}': not base64")))
            .transpose()
    }
}

impl Agent {
    /// A fresh agent (`is_init`: it is the guest's PID 1 and reaps every orphan).
    pub fn new(is_init: bool) -> Agent {
        Agent {
            programs: if is_init {
                Table::reaping_all()
            } else {
                Table::new()
            },
            files: Files::new(),
            is_init,
        }
    }

    /// Answers one request.
    pub fn handle(&mut self, req: &Json) -> Outcome {
        let Some(name) = req.get("execute").and_then(Json::as_str) else {
            return generic("Expected 'execute' in a request");
        };
        let args = Args(req.get("arguments"));
        if req
            .get("arguments")
            .is_some_and(|a| !matches!(a, Json::Obj(_) | Json::Null))
        {
            return generic("Invalid parameter type for 'arguments', expected: object");
        }
        match self.run(name, &args) {
            Ok(o) => o,
            Err(Refusal::Generic(e)) => generic(e),
            Err(Refusal::NotFound) => Outcome::Reply {
                json: error(
                    "CommandNotFound",
                    format!("The command {name} has not been found"),
                ),
                delimited: false,
            },
        }
    }

    fn run(&mut self, name: &str, a: &Args) -> Result<Outcome, Refusal> {
        Ok(match name {
            "guest-sync-delimited" | "guest-sync" => {
                let id = a.get("id").cloned().ok_or("Parameter 'id' is missing")?;
                Outcome::Reply {
                    json: Json::obj([("return", id)]),
                    delimited: name == "guest-sync-delimited",
                }
            }
            "guest-ping" => ret(Json::obj::<&str>([])),
            "guest-info" => ret(info()),
            "guest-exec" => {
                let start = Start {
                    path: a.str("path")?.to_string(),
                    args: a.opt_strings("arg")?.unwrap_or_default(),
                    env: a.opt_strings("env")?,
                    merge: a.opt_bool("env-merge")?.unwrap_or(false),
                    input: a.base64("input-data")?,
                    capture: capture(a.get("capture-output"))?,
                    cwd: a.opt_str("cwd")?.map(str::to_string),
                    group: a.opt_bool("group")?.unwrap_or(false),
                    keep_last: a
                        .opt_int("keep-last")?
                        .map(|n| n.clamp(4096, MAX_OUTPUT as i64) as usize),
                    image_user: a.opt_bool("as-image-user")?.unwrap_or(false),
                };
                let pid = self.programs.start(&start)?;
                ret(Json::obj([("pid", Json::Int(pid.into()))]))
            }
            "guest-exec-status" => {
                let pid = pid(a)?;
                let st = self
                    .programs
                    .status(pid, (0, 0), Duration::ZERO, (true, usize::MAX))?;
                ret(status_json(&st, false))
            }
            "mcqemu-exec-output" => {
                let pid = pid(a)?;
                let offset = |k: &str| -> Result<usize, String> {
                    let v = a.opt_int(k)?.unwrap_or(0);
                    usize::try_from(v).map_err(|_| format!("Invalid parameter '{k}'"))
                };
                let from = (offset("out-offset")?, offset("err-offset")?);
                let wait = a.opt_int("wait-ms")?.unwrap_or(0).clamp(0, 2000) as u64;
                let max = a.opt_int("max-bytes")?.unwrap_or(i64::MAX).max(0);
                let max = usize::try_from(max).unwrap_or(usize::MAX);
                let st =
                    self.programs
                        .status(pid, from, Duration::from_millis(wait), (false, max))?;
                ret(status_json(&st, true))
            }
            "mcqemu-kill" => {
                let sig = a.int("signal")?;
                if !(1..=64).contains(&sig) {
                    return Err("Invalid parameter 'signal'".to_string().into());
                }
                let sent = self.programs.signal(pid(a)?, sig as i32)?;
                ret(Json::obj([("signalled", Json::Bool(sent))]))
            }
            "mcqemu-list-dir" => {
                let max = a.opt_int("max")?.unwrap_or(10_000).clamp(0, 100_000) as usize;
                let (entries, truncated) = super::files::list_dir(a.str("path")?, max)?;
                let items = entries
                    .into_iter()
                    .map(|e| {
                        Json::obj([
                            ("name", Json::str(e.name)),
                            ("mode", Json::Int(e.mode.into())),
                            ("size", Json::Int(e.size as i64)),
                            ("mtime", Json::Int(e.mtime)),
                        ])
                    })
                    .collect();
                ret(Json::obj([
                    ("entries", Json::Arr(items)),
                    ("truncated", Json::Bool(truncated)),
                ]))
            }
            "guest-file-open" => {
                let h = self
                    .files
                    .open(a.str("path")?, a.opt_str("mode")?.unwrap_or("r"))?;
                ret(Json::Int(h))
            }
            "guest-file-read" => {
                let count = a.opt_int("count")?.unwrap_or(4096);
                let count =
                    usize::try_from(count).map_err(|_| "Invalid parameter 'count'".to_string())?;
                let (data, eof) = self.files.read(a.int("handle")?, count)?;
                ret(Json::obj([
                    ("count", Json::Int(data.len() as i64)),
                    ("buf-b64", Json::str(b64::encode(&data))),
                    ("eof", Json::Bool(eof)),
                ]))
            }
            "guest-file-write" => {
                let data = a
                    .base64("buf-b64")?
                    .ok_or("Parameter 'buf-b64' is missing")?;
                let data = match a.opt_int("count")? {
                    Some(c) if c < 0 || c as usize > data.len() => {
                        return Err("Invalid parameter 'count'".into())
                    }
                    Some(c) => &data[..c as usize],
                    None => &data[..],
                };
                let n = self.files.write(a.int("handle")?, data)?;
                ret(Json::obj([
                    ("count", Json::Int(n as i64)),
                    ("eof", Json::Bool(false)),
                ]))
            }
            "guest-file-seek" => {
                let whence = match a.get("whence") {
                    Some(Json::Str(s)) if s == "set" => Whence::Set,
                    Some(Json::Str(s)) if s == "cur" => Whence::Cur,
                    Some(Json::Str(s)) if s == "end" => Whence::End,
                    Some(Json::Int(0)) => Whence::Set,
                    Some(Json::Int(1)) => Whence::Cur,
                    Some(Json::Int(2)) => Whence::End,
                    _ => return Err("Invalid parameter 'whence'".into()),
                };
                let pos = self
                    .files
                    .seek(a.int("handle")?, a.int("offset")?, whence)?;
                ret(Json::obj([
                    ("position", Json::Int(pos as i64)),
                    ("eof", Json::Bool(false)),
                ]))
            }
            "guest-file-close" => {
                self.files.close(a.int("handle")?)?;
                ret(Json::obj::<&str>([]))
            }
            "guest-set-time" => {
                system::set_time(a.opt_int("time")?)?;
                ret(Json::obj::<&str>([]))
            }
            "guest-get-time" => ret(Json::Int(system::now_ns())),
            "guest-get-osinfo" => ret(system::os_info()),
            "guest-shutdown" => Outcome::Shutdown(Mode::parse(a.opt_str("mode")?)?),
            _ => return Err(Refusal::NotFound),
        })
    }
}

enum Refusal {
    Generic(String),
    NotFound,
}

impl From<String> for Refusal {
    fn from(s: String) -> Self {
        Refusal::Generic(s)
    }
}

impl From<&str> for Refusal {
    fn from(s: &str) -> Self {
        Refusal::Generic(s.to_string())
    }
}

fn pid(a: &Args) -> Result<i32, String> {
    i32::try_from(a.int("pid")?).map_err(|_| "Invalid parameter 'pid'".to_string())
}

/// `capture-output`: a boolean, or newer qemu-ga's mode names.
fn capture(v: Option<&Json>) -> Result<bool, String> {
    match v {
        None => Ok(false),
        Some(Json::Bool(b)) => Ok(*b),
        Some(Json::Str(s)) if s == "none" => Ok(false),
        Some(Json::Str(s)) if s == "separated" || s == "stdout" || s == "stderr" => Ok(true),
        _ => Err("Invalid parameter 'capture-output'".into()),
    }
}

fn info() -> Json {
    Json::obj([
        ("version", Json::str(VERSION)),
        (
            "supported_commands",
            Json::Arr(
                COMMANDS
                    .iter()
                    .map(|(n, answers)| {
                        Json::obj([
                            ("enabled", Json::Bool(true)),
                            ("name", Json::str(*n)),
                            ("success-response", Json::Bool(*answers)),
                        ])
                    })
                    .collect(),
            ),
        ),
    ])
}

/// A status in qemu-ga's shape; `offsets` adds mcqemu-exec-output's next offsets.
fn status_json(st: &exec::Status, offsets: bool) -> Json {
    let mut m = vec![("exited".to_string(), Json::Bool(st.exited))];
    if let Some(c) = st.exitcode {
        m.push(("exitcode".into(), Json::Int(c.into())));
    }
    if let Some(s) = st.signal {
        m.push(("signal".into(), Json::Int(s.into())));
    }
    // qemu-ga sends the data once the program has exited; the live command sends it always.
    if st.captured && (st.exited || offsets) {
        m.push(("out-data".into(), Json::str(b64::encode(&st.out))));
        m.push(("err-data".into(), Json::str(b64::encode(&st.err))));
        if st.out_truncated {
            m.push(("out-truncated".into(), Json::Bool(true)));
        }
        if st.err_truncated {
            m.push(("err-truncated".into(), Json::Bool(true)));
        }
    }
    if offsets {
        for (k, v) in [
            ("out-next", st.out_next),
            ("err-next", st.err_next),
            ("out-start", st.out_start),
            ("err-start", st.err_start),
            ("out-end", st.out_end),
            ("err-end", st.err_end),
        ] {
            m.push((k.into(), Json::Int(v as i64)));
        }
    }
    Json::Obj(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::json::parse;

    fn call(a: &mut Agent, text: &str) -> Json {
        match a.handle(&parse(text.as_bytes()).unwrap()) {
            Outcome::Reply { json, .. } => json,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn answers_in_qemu_ga_shapes() {
        let mut a = Agent::new(false);
        let r = call(
            &mut a,
            r#"{"execute":"guest-sync-delimited","arguments":{"id":42}}"#,
        );
        assert_eq!(r.to_text(), r#"{"return":42}"#);
        assert_eq!(
            call(&mut a, r#"{"execute":"guest-ping"}"#).to_text(),
            r#"{"return":{}}"#
        );
        let r = call(&mut a, r#"{"execute":"guest-bogus"}"#);
        assert_eq!(
            r.to_text(),
            r#"{"error":{"class":"CommandNotFound","desc":"The command guest-bogus has not been found"}}"#
        );
        let r = call(&mut a, r#"{"execute":"guest-exec","arguments":{"path":7}}"#);
        assert!(r.to_text().contains("GenericError"), "{}", r.to_text());
        let r = call(&mut a, r#"{"execute":"guest-info"}"#);
        assert!(r.to_text().contains("mcqemu-exec-output"));
        let r = call(
            &mut a,
            r#"{"execute":"guest-exec","arguments":{"path":"sh","arg":["-c","printf hi"],"capture-output":true}}"#,
        );
        let pid = r
            .get("return")
            .and_then(|r| r.get("pid"))
            .and_then(Json::as_i64)
            .unwrap();
        let done = (0..200).find_map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            let r = call(
                &mut a,
                &format!(r#"{{"execute":"guest-exec-status","arguments":{{"pid":{pid}}}}}"#),
            );
            let ret = r.get("return").cloned().unwrap();
            (ret.get("exited") == Some(&Json::Bool(true))).then_some(ret)
        });
        let done = done.expect("the program ended");
        assert_eq!(done.get("exitcode"), Some(&Json::Int(0)));
        assert_eq!(done.get("out-data").and_then(Json::as_str), Some("aGk="));
        let r = call(
            &mut a,
            r#"{"execute":"guest-shutdown","arguments":{"mode":"explode"}}"#,
        );
        assert!(r.to_text().contains("mode"));
        assert!(matches!(
            a.handle(&parse(br#"{"execute":"guest-shutdown"}"#).unwrap()),
            Outcome::Shutdown(Mode::Powerdown)
        ));
    }
}

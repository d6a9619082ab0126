//! Stopping a VM: a graceful ACPI power-down watched to its end, or a forced stop (quit,
//! SIGTERM, SIGKILL), each step verified. stop_vm, sandbox_destroy's callers, templates and
//! image_prepare stop VMs this way.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ops::error::OpError;
use crate::ops::session::explain_qmp;
use crate::ops::vm::records::{being_launched, lookup};
use crate::ops::work::Work;
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::{self, measure, Status};
use crate::qemu::{process, sock};
use crate::state::registry::Record;

crate::described! {
    /// How a stop went (stop_vm's result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Stopped {
        /// The VM.
        pub name: String,
        /// Always "stopped".
        pub status: &'static str,
        /// How: "already stopped", ACPI power-down, quit, SIGTERM, SIGKILL.
        pub method: String,
        /// What was seen on the way (QMP events, signals sent).
        pub events: Vec<String>,
        /// How long it took.
        pub elapsed_ms: u64,
        /// Runtime files that could not be removed.
        pub cleanup_errors: Vec<String>,
    }
}

/// Stops VM `name`: graceful (ACPI power-down watched for up to `timeout`) or forced.
pub fn stop(
    ctx: &dyn Work,
    name: &str,
    force: bool,
    timeout: Duration,
) -> Result<Stopped, OpError> {
    let name = name.to_string();
    let rec = lookup(&name)?;
    let started = Instant::now();
    // A forced stop never waits on the monitor just to learn the status: the process says
    // enough (a wedged QEMU must still end within about 2 s).
    let m = if force {
        vm::measure_process(&rec).unwrap_or(vm::Measured {
            status: Status::Running,
            detail: None,
        })
    } else {
        measure(&rec)
    };
    if m.status == Status::Starting {
        return Err(being_launched(&name));
    }
    if !m.alive() {
        let cleanup = vm::cleanup_runtime(&rec);
        return Ok(Stopped {
            name,
            status: "stopped",
            method: "already stopped".to_string(),
            events: Vec::new(),
            elapsed_ms: 0,
            cleanup_errors: cleanup,
        });
    }
    ctx.log("notice", &format!("stop_vm {name} (force={force})"));
    let (method, events) = if force {
        force_stop(&name, &rec)?
    } else {
        graceful_stop(ctx, &name, &rec, timeout)?
    };
    let cleanup = vm::cleanup_runtime(&rec);
    Ok(Stopped {
        name,
        status: "stopped",
        method,
        events,
        elapsed_ms: started.elapsed().as_millis() as u64,
        cleanup_errors: cleanup,
    })
}

fn gone(rec: &Record) -> bool {
    match vm::pid(rec) {
        Some(p) => !process::alive(p),
        None => !sock::is_listening(&vm::qmp_socket(rec)),
    }
}

fn graceful_stop(
    ctx: &dyn Work,
    name: &str,
    rec: &Record,
    timeout: Duration,
) -> Result<(String, Vec<String>), OpError> {
    let sock_path = vm::qmp_socket(rec);
    let started = Instant::now();
    let deadline = started + timeout;
    let outcome = qmp::with_session(&sock_path, |q| {
        q.system_powerdown()?;
        loop {
            if gone(rec) {
                drain_events(q);
                return Ok((true, q.event_names()));
            }
            ctx.progress(
                started.elapsed().as_secs_f64(),
                Some(timeout.as_secs_f64()),
                "waiting for the guest to power off after ACPI power-down",
            );
            if Instant::now() >= deadline || ctx.cancelled() {
                return Ok((false, q.event_names()));
            }
            match q.next_event(Duration::from_millis(100)) {
                Ok(_) => {}
                Err(QmpError::Closed) => {
                    // QEMU closed the monitor: it is exiting. Wait for the process, until the
                    // caller's deadline (at least a few seconds: a loaded host exits slowly).
                    let until = deadline.max(Instant::now() + Duration::from_secs(5));
                    while !gone(rec) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    return Ok((gone(rec), q.event_names()));
                }
                Err(e) => return Err(e),
            }
        }
    });
    let (ended, events) = outcome.map_err(|e| OpError::host(explain_qmp(name, rec, &e)))?;
    if ended {
        if events.iter().any(|e| e == "SHUTDOWN") {
            return Ok(("acpi".into(), events));
        }
        return Err(OpError::host(format!(
            "VM {name:?} exited without a guest shutdown event (events seen: [{}]): QEMU may have \
             crashed; see its serial log",
            events.join(", ")
        )));
    }
    ctx.check_cancel()?;
    Err(OpError::timed_out(format!(
        "VM {name:?} did not power off within {} s after ACPI power-down (events seen: [{}]). The \
         guest may ignore ACPI (no OS, still booting, or no acpid). Retry with a longer timeout, \
         or use force=true",
        timeout.as_secs_f64(),
        events.join(", ")
    )))
}

/// Reads the events QEMU wrote before it exited: a guest that powers off quickly has its
/// SHUTDOWN event still unread in the socket when the process is already gone (its
/// supervisor reaps it at once). Bounded: the socket ends at QEMU's exit.
fn drain_events(q: &mut qmp::Qmp) {
    let until = Instant::now() + Duration::from_secs(1);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if q.next_event(left).is_err() {
            break;
        }
    }
}

/// How long a forced stop gives QMP `quit` (greeting and reply together) before signals.
const QUIT_BUDGET: Duration = Duration::from_millis(700);
/// How long a forced stop waits for SIGTERM before SIGKILL.
const TERM_WAIT: Duration = Duration::from_millis(500);

fn force_stop(name: &str, rec: &Record) -> Result<(String, Vec<String>), OpError> {
    let sock_path = vm::qmp_socket(rec);
    if let Some(pid) = vm::pid(rec) {
        if !process::is_our_vm(pid, &vm::identity_socket(rec))
            && vm::spawned(rec)
            && process::alive(pid)
        {
            return Err(OpError::refused(format!(
                "PID {pid} is no longer VM {name:?}'s QEMU; refusing to signal it"
            )));
        }
        // A stopped process answers neither QMP nor SIGTERM: SIGKILL ends it all the same.
        if matches!(process::state(pid), Some('T') | Some('t')) {
            let steps = process::terminate_within(pid, Duration::ZERO)?;
            return Ok((
                steps.last().copied().unwrap_or("SIGKILL").to_string(),
                Vec::new(),
            ));
        }
    }
    let deadline = Instant::now() + QUIT_BUDGET;
    let quit = qmp::with_session_within(&sock_path, QUIT_BUDGET, |q| {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match q.quit_within(left) {
            Ok(_) | Err(QmpError::Closed) => Ok(q.event_names()),
            Err(e) => Err(e),
        }
    });
    let events = quit.as_ref().cloned().unwrap_or_default();
    match vm::pid(rec) {
        Some(pid) => {
            if quit.is_ok() && process::wait_dead(pid, Duration::from_secs(2)) {
                return Ok(("quit".into(), events));
            }
            let steps = process::terminate_within(pid, TERM_WAIT)?;
            Ok((steps.last().copied().unwrap_or("quit").to_string(), events))
        }
        None => {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if !sock::is_listening(&sock_path) {
                    return Ok(("quit".into(), events));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(OpError::host(format!(
                "VM {name:?} still answers on its QMP socket after quit, and no PID is known to \
                 signal; stop the QEMU process by hand"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    /// A QEMU that powers off fast: its SHUTDOWN event is still unread when it is gone.
    #[test]
    fn events_written_before_qemu_exited_are_read() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let qemu = std::thread::spawn(move || {
            let mut w = theirs.try_clone().unwrap();
            w.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"major\": 7, \"minor\": 2, \"micro\": 0}}}}\n")
                .unwrap();
            let mut line = String::new();
            BufReader::new(theirs).read_line(&mut line).unwrap();
            w.write_all(b"{\"return\": {}, \"id\": \"mcq-1\"}\n")
                .unwrap();
            w.write_all(b"{\"event\": \"POWERDOWN\"}\n{\"event\": \"SHUTDOWN\"}\n")
                .unwrap();
        });
        let mut q = qmp::Qmp::from_stream(ours, Duration::from_secs(5)).unwrap();
        qemu.join().unwrap();
        assert!(q.event_names().is_empty());
        let t = Instant::now();
        drain_events(&mut q);
        assert_eq!(q.event_names(), ["POWERDOWN", "SHUTDOWN"]);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
}

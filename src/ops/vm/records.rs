//! The VM records every VM operation starts from: look-ups that say how to find the right
//! name, the state of a launch not yet finished, and forgetting a record.

use serde_json::Map;

use crate::ops::error::OpError;
use crate::qemu::vm::{self, measure, Status};
use crate::state::config::VmConfig;
use crate::state::record::{Input, Record};

/// VM and template names: the rule, and the refusal naming it.
pub use crate::state::registry::{invalid_name, valid_name};

/// The VM's status as measured within `within` (a silent monitor cannot hold the caller).
pub fn status_within(rec: &Record, within: std::time::Duration) -> String {
    vm::measure_within(rec, within).status.to_string()
}

/// Looks up a VM record or says how to find the right name.
pub fn lookup(name: &str) -> Result<Record, OpError> {
    crate::state::registry::shared()
        .load()
        .remove(name)
        .ok_or_else(|| {
            OpError::not_found(format!(
                "no VM named {name:?}; list_vms shows the known VMs (attach_vm adopts one started \
             elsewhere)"
            ))
        })
}

/// Looks up a VM that must be running, judged without a QMP round trip (the caller's own
/// session will report a monitor that does not answer): a stopped VM or one still being
/// launched gets a clear error.
pub fn lookup_live(name: &str, what_next: &str) -> Result<Record, OpError> {
    let rec = lookup(name)?;
    match vm::measure_process(&rec) {
        Some(m) if m.status == Status::Starting => Err(being_launched(name)),
        Some(m) if !m.alive() => Err(OpError::invalid(format!(
            "VM {name:?} is not running; {what_next}"
        ))),
        _ => Ok(rec),
    }
}

/// The launch spec a VM runs, as its record keeps it (a fork's copies and a resume start the
/// same devices from it).
pub fn spec_of(name: &str, rec: &Record) -> Result<VmConfig, OpError> {
    if let Some(spec) = &rec.spec {
        return Ok(spec.clone());
    }
    // A spec the typed config could not read stays in `other`, as read.
    Err(match rec.other.get("spec").filter(|s| s.is_object()) {
        Some(damaged) => {
            let why = serde_json::from_value::<VmConfig>(damaged.clone())
                .err()
                .map_or_else(|| "unreadable".to_string(), |e| e.to_string());
            OpError::host(format!(
                "the launch spec in VM {name:?}'s record is damaged ({why}); it cannot be \
                 copied or saved"
            ))
        }
        None => OpError::invalid(format!(
            "VM {name:?} was started by an mcqemu that did not keep its launch spec, so it \
             cannot be copied or saved; sandbox_destroy it and start it again"
        )),
    })
}

/// The error for a VM whose launch (by this or another server) has not finished: its record
/// has no PID or final sockets yet, so stopping or pausing it now would act on nothing.
pub fn being_launched(name: &str) -> OpError {
    OpError::busy(format!(
        "VM {name:?} is still being launched; wait for launch_vm to return (list_vms shows it \
         running), then retry"
    ))
}

/// Drops VM `name`'s record (refused for a running VM mcqemu spawned, unless `force`); returns
/// whether its QEMU was still running. A stopped VM's leftover sockets are removed.
pub fn forget(name: &str, force: bool) -> Result<bool, OpError> {
    let name_c = name.to_string();
    let (was_running, rec) = crate::state::registry::shared().update(move |vms| {
        let rec = vms.get(&name_c).cloned().ok_or_else(|| {
            OpError::not_found(format!(
                "no VM named {name_c:?}; list_vms shows the known VMs"
            ))
        })?;
        let alive = measure(&rec).alive();
        if alive && vm::spawned(&rec) && !force {
            return Err(OpError::refused(format!(
                "VM {name_c:?} is still running; stop_vm it first, or pass force=true to leave it \
                 running unmanaged"
            )));
        }
        vms.remove(&name_c);
        Ok((alive, rec))
    })?;
    if !was_running {
        let _ = vm::cleanup_runtime(&rec);
    }
    Ok(was_running)
}

/// The input devices a launch gives a machine: a PC's PS/2 keyboard and mouse (relative), a
/// virt board's virtio keyboard, and everywhere the virtio tablet (absolute pointer); a kind
/// the machine lacks is the first such device `extra_args` adds (the input tools' refusal
/// advises exactly that).
pub fn input_devices(arch: &str, machine: &str, extra_args: &[String]) -> Input {
    let x86 = crate::qemu::cmdline::x86(arch);
    let pc = x86 && !machine.starts_with("microvm");
    let added = added_drivers(extra_args);
    let first = |kind: fn(&str) -> bool| -> String {
        added
            .iter()
            .find(|d| kind(d))
            .cloned()
            .unwrap_or_else(|| "none".into())
    };
    let keyboard = if pc {
        "ps2".to_string()
    } else if x86 {
        first(|d| d.contains("keyboard") || d == "usb-kbd")
    } else {
        "virtio".to_string()
    };
    let relative = if pc {
        "ps2".to_string()
    } else {
        first(|d| d.contains("mouse"))
    };
    Input {
        keyboard: Some(keyboard),
        pointer: Some("virtio-tablet".into()),
        relative_pointer: Some(relative),
        other: Map::new(),
    }
}

/// The drivers of the `-device X` options in `extra_args` (the driver is X's first bare
/// word, or its `driver=`).
fn added_drivers(extra_args: &[String]) -> Vec<String> {
    let mut values = Vec::new();
    let mut it = extra_args.iter();
    while let Some(a) = it.next() {
        let opt = a.trim_start_matches('-');
        if opt == "device" {
            values.extend(it.next().cloned());
        }
    }
    values
        .iter()
        .filter_map(|v| {
            let parts: Vec<&str> = v.split(',').collect();
            let first = parts.first().filter(|p| !p.contains('='));
            first.map(|p| p.to_string()).or_else(|| {
                parts
                    .iter()
                    .find_map(|p| p.strip_prefix("driver=").map(str::to_string))
            })
        })
        .collect()
}

/// The input device of `kind` (`keyboard`, `pointer`, `relative_pointer`) a VM's record says it
/// has; records from before input devices were recorded are PCs, which have all three.
pub fn input(rec: &Record, kind: InputKind) -> Option<&str> {
    let Some(i) = &rec.input else {
        return Some("unrecorded");
    };
    let device = match kind {
        InputKind::Keyboard => &i.keyboard,
        InputKind::Pointer => &i.pointer,
        InputKind::RelativePointer => &i.relative_pointer,
    };
    match device {
        None => Some("unrecorded"),
        Some(d) => Some(d.as_str()).filter(|d| *d != "none"),
    }
}

/// A kind of input device a VM may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A keyboard.
    Keyboard,
    /// An absolute pointer (the tablet).
    Pointer,
    /// A relative pointer (a mouse).
    RelativePointer,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcs_have_ps2_and_virt_boards_a_usb_keyboard_and_no_relative_mouse() {
        let rec = |i: Input| -> Record {
            Record {
                input: Some(i),
                ..Record::default()
            }
        };
        let pc = rec(input_devices("x86_64", "pc-q35-7.2", &[]));
        assert_eq!(input(&pc, InputKind::Keyboard), Some("ps2"));
        assert_eq!(input(&pc, InputKind::RelativePointer), Some("ps2"));
        let arm = rec(input_devices("aarch64", "virt-7.2", &[]));
        assert_eq!(input(&arm, InputKind::Keyboard), Some("virtio"));
        assert_eq!(input(&arm, InputKind::Pointer), Some("virtio-tablet"));
        assert_eq!(input(&arm, InputKind::RelativePointer), None);
        let micro = rec(input_devices("x86_64", "microvm", &[]));
        assert_eq!(input(&micro, InputKind::Keyboard), None);
        assert_eq!(
            input(&Record::default(), InputKind::Keyboard),
            Some("unrecorded")
        );
    }

    #[test]
    fn devices_added_through_extra_args_are_recorded() {
        let rec = |extra: &[&str]| -> Record {
            let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            Record {
                input: Some(input_devices("x86_64", "microvm", &extra)),
                ..Record::default()
            }
        };
        // The refusal's own advice: a microvm given a keyboard through extra_args has one.
        let kb = rec(&["-device", "virtio-keyboard-pci"]);
        assert_eq!(input(&kb, InputKind::Keyboard), Some("virtio-keyboard-pci"));
        let usb = rec(&["-device", "qemu-xhci", "-device", "driver=usb-kbd,id=k"]);
        assert_eq!(input(&usb, InputKind::Keyboard), Some("usb-kbd"));
        let mouse = rec(&["--device", "usb-mouse,bus=usb.0"]);
        assert_eq!(input(&mouse, InputKind::RelativePointer), Some("usb-mouse"));
        assert_eq!(input(&mouse, InputKind::Keyboard), None);
        // A PC keeps its PS/2 keyboard; naming a device's id "kbd" adds none.
        let pc = Record {
            input: Some(input_devices(
                "x86_64",
                "pc-q35-7.2",
                &["-device".into(), "e1000,id=kbd".into()],
            )),
            ..Record::default()
        };
        assert_eq!(input(&pc, InputKind::Keyboard), Some("ps2"));
    }
}

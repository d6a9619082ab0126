//! The screen this server last returned for each VM (vm_screenshot, vm_screen_wait): the
//! baseline vm_screen_wait waits to see change. Kept in memory as frames (one, or the two a
//! blinking screen alternates between), so that a wait on a region compares that region.
//! At most [`MAX_VMS`] VMs are remembered (the least recently updated is forgotten).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::qemu::screen::Frame;

/// Most VMs whose last screen is kept (each is one or two frames: ~3-12 MB at 1280x800 to
/// 1920x1080).
pub const MAX_VMS: usize = 32;

/// What was last returned for one VM.
#[derive(Clone)]
pub struct Seen {
    /// The frames (their whole-screen digests with them), the returned one first.
    pub frames: Vec<(u64, Arc<Frame>)>,
    /// When it was returned (a counter), for forgetting the oldest.
    stamp: u64,
}

struct Memory {
    by_vm: HashMap<String, Seen>,
    next: u64,
}

fn memory() -> &'static Mutex<Memory> {
    static M: std::sync::OnceLock<Mutex<Memory>> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        Mutex::new(Memory {
            by_vm: HashMap::new(),
            next: 0,
        })
    })
}

/// Remembers `frames` (the returned one first) as what was last returned for VM `name`.
pub fn remember(name: &str, frames: Vec<Arc<Frame>>) {
    let frames: Vec<(u64, Arc<Frame>)> = frames.into_iter().map(|f| (f.digest(None), f)).collect();
    let mut m = memory().lock().unwrap_or_else(|p| p.into_inner());
    m.next += 1;
    let stamp = m.next;
    m.by_vm.insert(name.to_string(), Seen { frames, stamp });
    while m.by_vm.len() > MAX_VMS {
        let oldest = m
            .by_vm
            .iter()
            .min_by_key(|(_, s)| s.stamp)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => m.by_vm.remove(&k),
            None => break,
        };
    }
}

/// What was last returned for VM `name`, if anything.
pub fn recall(name: &str) -> Option<Seen> {
    let m = memory().lock().unwrap_or_else(|p| p.into_inner());
    m.by_vm.get(name).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_screen_per_vm_and_forgets_the_oldest_past_the_cap() {
        let f = |v: u8| Arc::new(Frame::from_rgb(2, 1, vec![v; 6]).unwrap());
        remember("mem-a", vec![f(1)]);
        remember("mem-a", vec![f(2), f(3)]);
        let seen = recall("mem-a").unwrap();
        assert_eq!(seen.frames.len(), 2);
        assert_eq!(seen.frames[0].0, f(2).digest(None));
        for i in 0..MAX_VMS {
            remember(&format!("mem-x{i}"), vec![f(4)]);
        }
        assert!(recall("mem-a").is_none(), "the oldest is forgotten");
        assert!(recall(&format!("mem-x{}", MAX_VMS - 1)).is_some());
    }
}

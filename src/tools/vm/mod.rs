//! VM tools: launch, stop, pause/resume/attach/forget, list and info, port forwards, live
//! snapshots, the serial console.

pub mod forward;
pub mod inspect;
pub mod launch;
pub mod lifecycle;
pub mod lifetime;
pub mod mount;
pub mod serial;
pub mod snapshot;
pub mod stop;

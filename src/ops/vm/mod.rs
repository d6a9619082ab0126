//! A VM's life: its launch (the request, the checks of paths and images, quotas, the overlay's
//! size), the record every operation starts from, waiting for its agent, stopping it, and what
//! changes on a running VM (port forwards, the egress proxy, its serial console read and typed
//! into, live snapshots).

pub mod activity;
pub mod agent;
pub mod checks;
pub mod cloud_init;
pub mod disk_size;
pub mod egress;
pub mod ends;
pub mod hold;
pub mod inspect;
pub mod launch;
pub mod launch_args;
pub mod lifecycle;
pub mod lifetime;
pub mod metrics;
pub mod mounts;
pub mod port_forward;
pub mod quota;
pub mod records;
pub mod serial;
pub mod serial_write;
pub mod snapshot;
pub mod stop;

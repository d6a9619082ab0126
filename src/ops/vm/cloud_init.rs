//! What a result says of a guest's cloud-init (launch_vm's, sandbox_vm's, template_create's
//! `cloud_init` object): the seed a launch wrote, what the serial console said while the agent
//! was awaited, and cloud-init's own report once it finished.

use serde::Serialize;
use serde_json::Value;

use crate::state::record::Seed;

crate::described! {
    /// A result's `cloud_init` (in this order; each part only once it is known).
    #[derive(Debug, Clone, Default, PartialEq, Serialize)]
    pub struct CloudInitOut {
        /// The seed's instance id (a fresh one each launch).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub instance_id: Option<String>,
        /// The seed ISO's path.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub seed: Option<String>,
        /// cloud-init's final message on the console, when the agent never answered.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub console: Option<ConsoleFinish>,
        /// `done`, `error`, ... (the console's verdict, then cloud-init's own).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub status: Option<String>,
        /// The modules that failed, as the console and cloud-init's errors name them.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub failed_modules: Option<Vec<String>>,
        /// cloud-init finished (its end awaited through the agent).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub finished: Option<bool>,
        /// How long that wait took.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub wait_ms: Option<u64>,
        /// `cloud-init status`'s exit code (`null` when a signal ended it).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub exitcode: Option<Option<i64>>,
        /// `cloud-init status --format json` as cloud-init printed it (its fields vary by
        /// version, so they are passed on as they are).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub report: Option<Value>,
    }
}

crate::described! {
    /// cloud-init's final message as the console showed it.
    #[derive(Debug, Clone, PartialEq, Serialize)]
    pub struct ConsoleFinish {
        /// Always true: the message came.
        pub finished: bool,
        /// The datasource it used, as it names it.
        pub datasource: String,
        /// cloud-init's version.
        pub version: String,
        /// The guest's uptime then.
        pub uptime_s: Option<f64>,
    }
}

/// What waiting for cloud-init's end found (`guest::run::wait_cloud_init`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waited {
    /// How long the wait took.
    pub wait_ms: u64,
    /// `cloud-init status`'s exit code.
    pub exitcode: Option<i64>,
    /// Its `status` (`done`, `error`, `degraded done`, ...).
    pub status: Option<String>,
    /// Its whole report, as printed.
    pub report: Value,
    /// The failed modules its errors and the console named.
    pub failed_modules: Vec<String>,
}

impl CloudInitOut {
    /// The seed a launch recorded (its instance id and path).
    pub fn of_seed(seed: &Seed) -> CloudInitOut {
        CloudInitOut {
            instance_id: seed.instance_id.clone(),
            seed: seed.seed.clone(),
            ..CloudInitOut::default()
        }
    }

    /// Lays what the wait found over this (its status and modules replace the console's).
    pub fn add_waited(&mut self, w: Waited) {
        self.finished = Some(true);
        self.wait_ms = Some(w.wait_ms);
        self.exitcode = Some(w.exitcode);
        self.status = w.status;
        self.report = Some(w.report);
        self.failed_modules = Some(w.failed_modules);
    }
}

//! sandbox_vm's result: the launch, then what the sandbox adds to it (each part only where it
//! applies: an overlay's wait, a clone's steps, a pooled clone's hand-over).

use serde::Serialize;

use crate::ops::vm::launch::Launched;

crate::described! {
    /// sandbox_vm's result (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Sandboxed {
        /// The launch (its status the sandbox's now).
        #[serde(flatten)]
        pub launched: Launched,
        /// Where a clone's time went.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub steps_ms: Option<CloneSteps>,
        /// The template it was cloned from.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub template: Option<String>,
        /// It came warm from the template's pool.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub pooled: Option<bool>,
        /// Whether its agent answered.
        pub agent_ready: bool,
        /// How long the agent was awaited (an overlay's sandbox).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub agent_wait_ms: Option<u64>,
        /// Its overlay (its disk).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub overlay: Option<String>,
        /// The image under the overlay.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub base_image: Option<String>,
        /// How long the call took until the clone was ready.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub ready_ms: Option<u64>,
        /// The image's Entrypoint and Cmd started in the background (`run`): its handle.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub image_process: Option<crate::ops::guest::background::Started>,
    }
}

impl Sandboxed {
    /// A launch with nothing added yet.
    pub fn of(launched: Launched) -> Sandboxed {
        Sandboxed {
            launched,
            steps_ms: None,
            template: None,
            pooled: None,
            agent_ready: false,
            agent_wait_ms: None,
            overlay: None,
            base_image: None,
            ready_ms: None,
            image_process: None,
        }
    }
}

crate::described! {
    /// Where a clone's time went, in milliseconds (tenths kept).
    #[derive(Debug, Clone, Copy, PartialEq, Serialize)]
    pub struct CloneSteps {
        /// Making its overlay.
        pub overlay: f64,
        /// Starting its QEMU.
        pub qemu_start: f64,
        /// Loading the template's state.
        pub state_load: f64,
        /// Its agent's first answer.
        pub first_agent_answer: f64,
    }
}

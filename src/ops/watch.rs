//! A download's progress and cancellation, from the call's context.

use super::work::Work;
use crate::net::download::Watcher;

/// Progress and cancellation of a download, from the tool call's context.
pub struct CtxWatch<'a>(pub &'a dyn Work);

impl Watcher for CtxWatch<'_> {
    fn progress(&self, done: u64, total: Option<u64>) {
        let msg = match total {
            Some(t) => format!("{done} of {t} bytes"),
            None => format!("{done} bytes"),
        };
        self.0.progress(done as f64, total.map(|t| t as f64), &msg);
    }
    fn cancelled(&self) -> bool {
        self.0.cancelled()
    }
}

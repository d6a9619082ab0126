//! Blobs moved a few at a time. A pushed or pulled guest is hundreds of blobs (its memory in
//! windows), and one at a time each costs its round trips to the registry in turn; a few
//! sessions side by side overlap them. The caller's thread keeps the progress and the cancel:
//! workers only move bytes and say how many.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::client::Client;
use super::error::OciError;

/// Sessions side by side.
pub const WORKERS: usize = 4;

/// What a worker's item sees: where it says its bytes, and whether to give up.
pub struct Mover<'a> {
    moved: &'a dyn Fn(u64),
    stop: &'a AtomicBool,
}

impl Mover<'_> {
    /// The bytes of this item moved so far.
    pub fn moved(&self, n: u64) {
        (self.moved)(n)
    }

    /// True once the transfer is cancelled or another item failed.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// What a worker says.
enum Said<R> {
    /// More bytes moved.
    Moved(u64),
    /// Item `i` is done.
    Done(usize, Result<R, OciError>),
}

/// Runs `each` on every item, [`WORKERS`] at a time, each worker with its own session from
/// `session`. `each` says through its [`Mover`] the bytes it has moved of its item so far;
/// `progress` hears the sum over all items. The first error (or a cancel) stops the workers
/// before their next item and is returned; otherwise the results in the items' order.
pub fn each<T, R>(
    items: &[T],
    session: &(dyn Fn() -> Result<Client, OciError> + Sync),
    each: &(dyn Fn(&mut Client, &T, &Mover) -> Result<R, OciError> + Sync),
    progress: &dyn Fn(u64),
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<R>, OciError>
where
    T: Sync,
    R: Send,
{
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<Said<R>>();
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    let mut failed = None;
    std::thread::scope(|s| {
        for _ in 0..WORKERS.min(items.len()) {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            s.spawn(move || worker(items, session, each, next, stop, tx));
        }
        drop(tx);
        let mut total = 0;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Said::Moved(n)) => {
                    total += n;
                    progress(total);
                }
                Ok(Said::Done(i, Ok(r))) => {
                    if let Some(slot) = results.get_mut(i) {
                        *slot = Some(r);
                    }
                }
                Ok(Said::Done(_, Err(e))) => {
                    stop.store(true, Ordering::Relaxed);
                    failed.get_or_insert(e);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if failed.is_none() && cancelled() {
                stop.store(true, Ordering::Relaxed);
                failed = Some(OciError::Cancelled("cancelled by the client".into()));
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| OciError::Host("a blob was left unmoved".into())))
        .collect()
}

/// One worker: its own session, then items taken in turn until none is left or `stop`.
fn worker<T, R>(
    items: &[T],
    session: &(dyn Fn() -> Result<Client, OciError> + Sync),
    each: &(dyn Fn(&mut Client, &T, &Mover) -> Result<R, OciError> + Sync),
    next: &AtomicUsize,
    stop: &AtomicBool,
    tx: mpsc::Sender<Said<R>>,
) {
    let mut c = match session() {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.send(Said::Done(usize::MAX, Err(e)));
            return;
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let last = std::cell::Cell::new(0u64);
        let moved = |n: u64| {
            let delta = n.saturating_sub(last.replace(n));
            if delta > 0 {
                let _ = tx.send(Said::Moved(delta));
            }
        };
        let r = each(
            &mut c,
            item,
            &Mover {
                moved: &moved,
                stop,
            },
        );
        let _ = tx.send(Said::Done(i, r));
    }
}

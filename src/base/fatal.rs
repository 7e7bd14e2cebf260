//! What a process does when one of its threads panics: it ends, loudly.
//!
//! A router shard owns its keys' buckets and its models' routing state alone; a shard thread that
//! died would leave the process up and half dead (its accepted connections unanswered, its models
//! timing out, `/health` and `/metrics` still green). Nothing can take its state over, so the only
//! safe answer is to stop the whole process with one clear log line and let the supervisor
//! (systemd, Kubernetes) restart it. The same holds for a thread that returns when it must run
//! for the life of the process: [`ThreadGuard`] reports that.

use std::sync::mpsc;

/// Makes any panic, on any thread, end the process after the standard panic report, with one
/// `error` line naming the thread. Call once, at the start of `main`.
pub fn abort_on_panic(process: &'static str) {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        let location = info
            .location()
            .map(|location| format!("{}:{}", location.file(), location.line()))
            .unwrap_or_default();
        tracing::error!(
            thread,
            %location,
            "{process}: thread {thread} panicked; stopping the process (its state cannot be served without it)"
        );
        std::process::abort();
    }));
}

/// Tells the process a thread that must run for its whole life has ended. Hold one in the thread;
/// it reports on drop, whether the thread returned or unwound.
pub struct ThreadGuard {
    name: String,
    ended: mpsc::Sender<String>,
}

impl ThreadGuard {
    pub fn new(name: impl Into<String>, ended: mpsc::Sender<String>) -> ThreadGuard {
        ThreadGuard {
            name: name.into(),
            ended,
        }
    }
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        let _ = self.ended.send(std::mem::take(&mut self.name));
    }
}

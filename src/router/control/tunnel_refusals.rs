//! The control core's rate-limited log lines for refused tunnel connections: at most one WARN
//! line per [`REFUSAL_LOG_INTERVAL`] for each kind, counting the ones left out.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use crate::base::log_limit::LogLimit;
use crate::router::shard::tunnels::REFUSAL_LOG_INTERVAL;

/// The control core's tunnel refusal lines: this module's and the session check's in `control`.
pub struct RefusalLog {
    refused: Mutex<LogLimit>,
    accept_failed: Mutex<LogLimit>,
}

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog {
            refused: Mutex::new(LogLimit::new(REFUSAL_LOG_INTERVAL)),
            accept_failed: Mutex::new(LogLimit::new(REFUSAL_LOG_INTERVAL)),
        }
    }
}

impl RefusalLog {
    /// A refused tunnel connection: a WARN line unless one was written less than
    /// [`REFUSAL_LOG_INTERVAL`] ago.
    pub fn refused(&self, remote: Option<SocketAddr>, session: Option<u32>, reason: &str) {
        let noted = self
            .refused
            .lock()
            .expect("refusal log lock poisoned")
            .note(Instant::now());
        if let Some(suppressed) = noted {
            tracing::warn!(
                ?remote,
                ?session,
                reason,
                suppressed,
                "tunnel refused (at most one such line per 10 s; suppressed: refusals since the previous line)"
            );
        }
    }

    pub(super) fn accept_failed(&self, error: &std::io::Error) {
        let noted = self
            .accept_failed
            .lock()
            .expect("refusal log lock poisoned")
            .note(Instant::now());
        if let Some(suppressed) = noted {
            tracing::warn!(%error, suppressed, "tunnel accept failed (at most one such line per 10 s)");
        }
    }
}

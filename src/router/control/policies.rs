//! The control core's routing policies: the active set, published through a `watch` channel
//! every shard follows, the static keys of `auth.yaml` that policies and keys share, and the
//! reload counts. How a new set is loaded and committed is `policy_reload`'s job.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::logic::auth::config::{AuthConfig, ServerlessLimits};
use crate::logic::auth::keys::KeyRegistry;
use crate::logic::policy::dir::DirState;
use crate::logic::policy::{PolicyContext, PolicySet};

/// Where the policies come from; fixed at start-up.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `--policy-file`.
    pub file: Option<PathBuf>,
    /// `--policy-model-dir`; when set, reloads read it instead of `file`.
    pub dir: Option<PathBuf>,
}

/// The start-up result: the set, and what the directory pass applied (for later reloads).
#[derive(Debug, Clone)]
pub struct Initial {
    pub set: PolicySet,
    pub dir_state: DirState,
}

/// What triggered a policy change, as the `trigger` label of `hivenet_policy_reload_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Sighup,
    FileChange,
    Api,
}

impl Trigger {
    pub const ALL: [Trigger; 3] = [Trigger::Sighup, Trigger::FileChange, Trigger::Api];

    pub fn label(self) -> &'static str {
        match self {
            Trigger::Sighup => "sighup",
            Trigger::FileChange => "file_change",
            Trigger::Api => "api",
        }
    }
}

/// The policy side of [`ControlShared`]: the active set, published through a `watch` channel,
/// and what the reverse key check needs.
pub struct PolicyControl {
    /// The active set; `subscribe()` for change notifications (the shards' feed).
    pub(super) current: watch::Sender<Arc<PolicySet>>,
    /// The active static `auth.yaml` configuration, for the reverse serverless check on policy
    /// changes. Written by `auth_reload` under this lock after its own check.
    pub(super) static_auth: Mutex<Arc<AuthConfig>>,
    /// The active static keys (the same registry the shards hold), for the quota gauges of
    /// `/metrics`; empty in dynamic mode. Written by `auth_reload` with `static_auth`.
    pub(super) static_keys: Mutex<Arc<KeyRegistry>>,
    /// What the last directory pass applied; used by reloads only.
    pub(super) dir_state: Mutex<DirState>,
    pub context: PolicyContext,
    pub sources: Sources,
    /// `[trigger][0: success, 1: error]`.
    pub(super) reloads: [[AtomicU64; 2]; 3],
}

impl PolicyControl {
    pub fn new(
        initial: Initial,
        context: PolicyContext,
        sources: Sources,
        static_auth: AuthConfig,
        static_keys: Arc<KeyRegistry>,
    ) -> PolicyControl {
        let (current, _) = watch::channel(Arc::new(initial.set));
        PolicyControl {
            current,
            static_auth: Mutex::new(Arc::new(static_auth)),
            static_keys: Mutex::new(static_keys),
            dir_state: Mutex::new(initial.dir_state),
            context,
            sources,
            reloads: Default::default(),
        }
    }

    /// The active set.
    pub fn current(&self) -> Arc<PolicySet> {
        self.current.borrow().clone()
    }

    /// A receiver that sees every set installed from now on (and the current one).
    pub fn subscribe(&self) -> watch::Receiver<Arc<PolicySet>> {
        self.current.subscribe()
    }

    /// The active set's serverless limits, for key validation.
    pub fn serverless_limits(&self) -> ServerlessLimits {
        self.current.borrow().serverless_limits()
    }

    /// The static-auth slot; `auth_reload` holds it while it checks and installs a new file.
    pub fn static_auth(&self) -> MutexGuard<'_, Arc<AuthConfig>> {
        self.static_auth.lock().expect("static auth lock poisoned")
    }

    /// The active static keys (see the field).
    pub fn static_keys(&self) -> Arc<KeyRegistry> {
        self.static_keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Installs the static keys a reload loaded (with its `static_auth` held).
    pub fn set_static_keys(&self, keys: Arc<KeyRegistry>) {
        *self
            .static_keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = keys;
    }

    pub fn count_reload(&self, trigger: Trigger, success: bool) {
        self.reloads[trigger as usize][usize::from(!success)].fetch_add(1, Ordering::Relaxed);
    }

    /// `(trigger, result, count)` for every series of `hivenet_policy_reload_total`.
    pub fn reload_counts(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut counts = Vec::with_capacity(6);
        for trigger in Trigger::ALL {
            for (index, result) in ["success", "error"].into_iter().enumerate() {
                counts.push((
                    trigger.label(),
                    result,
                    self.reloads[trigger as usize][index].load(Ordering::Relaxed),
                ));
            }
        }
        counts
    }
}

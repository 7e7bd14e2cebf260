//! Loading the routing policies (`--policy-file`, `--policy-model-dir`) at start-up and on every
//! change: SIGHUP, or the file's / directory's files' modification time or size changing (checked
//! every [`POLL_INTERVAL`]). Also the one place a new policy set is installed ([`commit`]), for
//! reloads and admin writes alike.
//!
//! Start-up refuses an invalid `--policy-file` or `_default.yaml`, an unreadable directory, and
//! policies that would invalidate a static key (cross-config serverless check). A reload never
//! stops the router: an invalid change is logged and the previous policy stays active (for a
//! directory, per file, as `policy::dir` describes).
//!
//! Invariant: the active set and every key (static and dynamic) satisfy the serverless invariant
//! together. [`commit`] checks a new set against the keys under the locks of both, in the order
//! `dynamic_keys` → `static_auth` → the policy watch, and key writers check the active set while
//! holding their own lock, so no interleaving of a key write and a policy write can pass both
//! checks against stale data.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::logic::auth::config::Problems as KeyProblems;
use crate::logic::policy::dir::{self, DirFile, DirState, Phase};
use crate::logic::policy::{
    Origin, PolicyContext, PolicyEntry, PolicyError, PolicySet, Role, compile_text,
};
use crate::router::control::ControlShared;
use crate::router::control::policies::{Initial, Sources, Trigger};

pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Most files read from `--policy-model-dir`; a bound so a wrong directory cannot exhaust memory.
pub const MAX_DIR_FILES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read --policy-file {path}: {source}")]
    ReadFile {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read --policy-model-dir {path}: {message}")]
    ReadDir { path: String, message: String },
    #[error("{0}")]
    Invalid(#[from] PolicyError),
}

/// Why [`commit`] did not install a set.
#[derive(Debug)]
pub enum CommitError<E> {
    /// The change itself was refused (invalid, conflicting).
    Build(E),
    /// The new set would make existing keys invalid; every such key is listed.
    Keys(KeyProblems),
}

/// Builds a new set from the active one with `build` and installs it, unless some static or
/// dynamic key would break the serverless invariant under it. Returns the installed set and
/// whatever `build` returned alongside it.
pub fn commit<T, E>(
    shared: &ControlShared,
    build: impl FnOnce(&PolicySet) -> Result<(PolicySet, T), E>,
) -> Result<(Arc<PolicySet>, T), CommitError<E>> {
    // Lock order: dynamic keys, static auth, then the watch (see the module doc).
    let dynamic = shared
        .dynamic_keys
        .as_ref()
        .map(|registry| registry.lock().expect("dynamic key registry lock poisoned"));
    let static_auth = shared.policies.static_auth();
    let current = shared.policies.current();
    let (next, extra) = build(&current).map_err(CommitError::Build)?;
    let limits = next.serverless_limits();
    let mut problems = Vec::new();
    if let Err(found) = static_auth.check_serverless(&limits) {
        problems.extend(found.0);
    }
    if let Some(dynamic) = &dynamic
        && let Err(found) = dynamic.check_serverless(&limits)
    {
        problems.extend(found.0);
    }
    if !problems.is_empty() {
        return Err(CommitError::Keys(KeyProblems(problems)));
    }
    let next = Arc::new(next);
    shared.policies.current.send_replace(next.clone());
    Ok((next, extra))
}

// ---------------------------------------------------------------------------------------------
// Start-up.
// ---------------------------------------------------------------------------------------------

/// Reads and validates the configured policies. Logs every skipped file and warning.
pub fn load_initial(sources: &Sources, context: &PolicyContext) -> Result<Initial, LoadError> {
    let mut set = PolicySet::built_in(context);
    if let Some(path) = &sources.file {
        let entry = read_global_file(path, context)?;
        set = set.replace_global(entry);
    }
    let mut dir_state = DirState::default();
    if let Some(dir) = &sources.dir {
        let files = list_dir(dir)?;
        let outcome = dir::apply(
            dir,
            &set,
            &DirState::default(),
            &files,
            Phase::Startup,
            context,
        )?;
        log_outcome(&outcome.changes, &outcome.refused, &outcome.warnings);
        if let (Some(file), Origin::File(default)) = (&sources.file, &outcome.set.global().origin)
            && default.starts_with(dir)
        {
            tracing::warn!(
                policy_file = %file.display(),
                default = %default.display(),
                "the policy directory's _default replaces --policy-file as the global policy"
            );
        }
        set = outcome.set;
        dir_state = outcome.state;
    }
    tracing::info!(
        global = ?set.global().origin,
        named = set.named().len(),
        "routing policies loaded"
    );
    Ok(Initial { set, dir_state })
}

fn read_global_file(path: &Path, context: &PolicyContext) -> Result<PolicyEntry, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::ReadFile {
        path: path.display().to_string(),
        source,
    })?;
    let origin = format!("--policy-file {}", path.display());
    let compiled = compile_text(&origin, &text, Role::Global, context)?;
    for warning in &compiled.warnings {
        tracing::warn!("{origin}: {warning}");
    }
    Ok(PolicyEntry::new(compiled, Origin::File(path.to_owned())))
}

/// The directory's `.yaml`/`.yml` regular files (symlinks followed), with their contents.
fn list_dir(dir: &Path) -> Result<Vec<DirFile>, LoadError> {
    let failed = |message: String| LoadError::ReadDir {
        path: dir.display().to_string(),
        message,
    };
    let entries = std::fs::read_dir(dir).map_err(|error| failed(error.to_string()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| failed(error.to_string()))?;
        let Ok(file_name) = entry.file_name().into_string() else {
            continue; // not UTF-8: cannot be a policy name
        };
        if !(file_name.ends_with(".yaml") || file_name.ends_with(".yml")) {
            continue;
        }
        let path = entry.path();
        let Ok(metadata) = std::fs::metadata(&path) else {
            continue; // vanished, or a dangling symlink
        };
        if !metadata.is_file() {
            continue;
        }
        if files.len() == MAX_DIR_FILES {
            return Err(failed(format!("more than {MAX_DIR_FILES} policy files")));
        }
        files.push(DirFile {
            file_name,
            modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            text: std::fs::read_to_string(&path).map_err(|error| error.to_string()),
        });
    }
    Ok(files)
}

fn log_outcome(changes: &[String], refused: &[String], warnings: &[String]) {
    for change in changes {
        tracing::info!("policy: {change}");
    }
    for refusal in refused {
        tracing::error!("policy refused: {refusal}");
    }
    for warning in warnings {
        tracing::warn!("policy: {warning}");
    }
}

// ---------------------------------------------------------------------------------------------
// Reload.
// ---------------------------------------------------------------------------------------------

/// Rereads the directory (or, without one, the global file) and installs what is valid.
pub fn reload(shared: &ControlShared, trigger: Trigger) {
    let policies = &shared.policies;
    let context = policies.context;
    if let Some(dir) = &policies.sources.dir {
        let files = match list_dir(dir) {
            Ok(files) => files,
            Err(error) => {
                tracing::error!(trigger = trigger.label(), %error, "policy reload refused; the previous policies stay active");
                policies.count_reload(trigger, false);
                return;
            }
        };
        let mut dir_state = policies
            .dir_state
            .lock()
            .expect("policy dir state lock poisoned");
        let result = commit(shared, |current| {
            dir::apply(dir, current, &dir_state, &files, Phase::Reload, &context).map(|outcome| {
                (
                    outcome.set,
                    (
                        outcome.state,
                        outcome.changes,
                        outcome.refused,
                        outcome.warnings,
                    ),
                )
            })
        });
        match result {
            Ok((set, (state, changes, refused, warnings))) => {
                *dir_state = state;
                log_outcome(&changes, &refused, &warnings);
                tracing::info!(
                    trigger = trigger.label(),
                    dir = %dir.display(),
                    changed = changes.len(),
                    refused = refused.len(),
                    named = set.named().len(),
                    "policy directory reloaded"
                );
                policies.count_reload(trigger, refused.is_empty());
            }
            Err(CommitError::Build(error)) => {
                tracing::error!(trigger = trigger.label(), %error, "policy reload refused; the previous policies stay active");
                policies.count_reload(trigger, false);
            }
            Err(CommitError::Keys(problems)) => {
                tracing::error!(trigger = trigger.label(), %problems, "policy reload refused: it would invalidate API keys; the previous policies stay active");
                policies.count_reload(trigger, false);
            }
        }
    } else if let Some(path) = &policies.sources.file {
        let entry = match read_global_file(path, &context) {
            Ok(entry) => entry,
            Err(error) => {
                tracing::error!(trigger = trigger.label(), %error, "policy reload refused; the previous policy stays active");
                policies.count_reload(trigger, false);
                return;
            }
        };
        match commit(shared, |current| {
            Ok::<_, std::convert::Infallible>((current.replace_global(entry), ()))
        }) {
            Ok(_) => {
                tracing::info!(trigger = trigger.label(), path = %path.display(), "global policy reloaded");
                policies.count_reload(trigger, true);
            }
            Err(CommitError::Build(never)) => match never {},
            Err(CommitError::Keys(problems)) => {
                tracing::error!(trigger = trigger.label(), %problems, "policy reload refused: it would invalidate API keys; the previous policy stays active");
                policies.count_reload(trigger, false);
            }
        }
    }
}

/// What identifies a version of the sources cheaply: each file's modification time and length.
fn stamp(sources: &Sources) -> Vec<(String, Option<(SystemTime, u64)>)> {
    let of = |path: &Path| {
        let metadata = std::fs::metadata(path).ok()?;
        Some((metadata.modified().ok()?, metadata.len()))
    };
    if let Some(dir) = &sources.dir {
        let mut stamps: Vec<_> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|entry| {
                        entry
                            .file_name()
                            .into_string()
                            .ok()
                            .map(|name| (name, entry.path()))
                    })
                    .filter(|(name, _)| name.ends_with(".yaml") || name.ends_with(".yml"))
                    .take(MAX_DIR_FILES + 1)
                    .map(|(name, path)| (name, of(&path)))
                    .collect()
            })
            .unwrap_or_default();
        stamps.sort();
        stamps
    } else if let Some(path) = &sources.file {
        vec![(path.display().to_string(), of(path))]
    } else {
        Vec::new()
    }
}

/// Reloads on SIGHUP and on file change until the process ends. Does nothing without sources.
pub async fn watch(shared: Arc<ControlShared>) {
    let sources = shared.policies.sources.clone();
    if sources.dir.is_none() && sources.file.is_none() {
        return;
    }
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP; policies reload on file change only");
            None
        }
    };
    let mut last = stamp(&sources);
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    loop {
        let trigger = tokio::select! {
            _ = ticker.tick() => {
                let now = stamp(&sources);
                if now == last {
                    continue;
                }
                last = now;
                Trigger::FileChange
            }
            Some(()) = async {
                match hangups.as_mut() {
                    Some(hangups) => hangups.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                last = stamp(&sources);
                Trigger::Sighup
            }
        };
        // Reading and compiling the files happens on a blocking thread: see `control`.
        let reloading = shared.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || reload(&reloading, trigger)).await {
            tracing::error!(%error, "policy reload failed; the previous policies stay active");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("hivenet-policy-load-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn start_up_reads_the_file_then_the_directory() {
        let dir = temp_dir("both");
        let file = dir.join("global.yaml");
        std::fs::write(
            &file,
            "max_inflight: 1\nrouting_policy: {strategy: least-loaded}\n",
        )
        .unwrap();
        let policies = dir.join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(
            policies.join("a.yaml"),
            "models: [m]\nrouting_policy: {strategy: least-loaded}\n",
        )
        .unwrap();
        std::fs::write(policies.join("notes.txt"), "ignored").unwrap();
        let mut sources = Sources {
            file: Some(file.clone()),
            dir: Some(policies.clone()),
        };
        let context = PolicyContext::default();
        let initial = load_initial(&sources, &context).unwrap();
        assert_eq!(initial.set.global().policy.max_inflight, 1);
        assert_eq!(initial.set.owner_of("m"), Some("a"));

        // _default.yaml wins over --policy-file.
        std::fs::write(
            policies.join("_default.yaml"),
            "max_inflight: 2\nrouting_policy: {strategy: least-loaded}\n",
        )
        .unwrap();
        let initial = load_initial(&sources, &context).unwrap();
        assert_eq!(initial.set.global().policy.max_inflight, 2);

        // An invalid global file stops start-up, naming the flag and the path.
        std::fs::write(&file, "routing_policy: {strategy: fastest}\n").unwrap();
        let error = load_initial(&sources, &context).unwrap_err().to_string();
        assert!(error.contains("--policy-file"), "{error}");
        assert!(error.contains("global.yaml"), "{error}");

        sources.file = Some(dir.join("missing.yaml"));
        let error = load_initial(&sources, &context).unwrap_err().to_string();
        assert!(error.contains("cannot read --policy-file"), "{error}");
        sources.file = None;
        sources.dir = Some(dir.join("missing"));
        let error = load_initial(&sources, &context).unwrap_err().to_string();
        assert!(error.contains("cannot read --policy-model-dir"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stamps_change_with_the_directory() {
        let dir = temp_dir("stamp");
        let sources = Sources {
            file: None,
            dir: Some(dir.clone()),
        };
        let empty = stamp(&sources);
        std::fs::write(dir.join("a.yaml"), "x").unwrap();
        let one = stamp(&sources);
        assert_ne!(empty, one);
        std::fs::write(dir.join("a.yaml"), "xy").unwrap();
        assert_ne!(one, stamp(&sources));
        std::fs::write(dir.join("ignored.txt"), "x").unwrap();
        let before = stamp(&sources);
        std::fs::write(dir.join("ignored.txt"), "xyz").unwrap();
        assert_eq!(before, stamp(&sources));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

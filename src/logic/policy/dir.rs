//! `--policy-model-dir`: turning the directory's files into policy-set changes, at start-up and
//! on every reload, as the policy reference prescribes ("Per-model policy directory",
//! "`_default.yaml`", "Named per-model files", "Model ownership conflicts", "Per-model file
//! errors", "Reload policies with SIGHUP").
//!
//! Rules:
//! - only `.yaml` and `.yml` files count; `_default.yaml` (or `_default.yml`) is the global
//!   policy, its `models` ignored; every other file is a named document named by its stem;
//! - named files are applied oldest first (modification time, then file name): a file claiming a
//!   model another document already owns is skipped whole;
//! - at start-up an invalid `_default` is fatal; an invalid named file, one without `models`, or
//!   a conflicting one is skipped with a note;
//! - on reload, a file whose text is what was last applied is not reapplied (so an admin-API
//!   change to its document survives); a changed valid file replaces its document; a deleted
//!   file's document is removed (a deleted `_default` reverts the global policy to the built-in
//!   one); an invalid, conflicting or unreadable file leaves the previous document active.
//!
//! Must not: touch the file system. The caller lists the directory into [`DirFile`]s; this module
//! decides. A refused file is not recorded as applied, so it is tried again on the next reload
//! (for example once the file owning its model is gone).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use super::compile::{PolicyContext, PolicyError, Role, compile_text};
use super::set::{Origin, PolicyEntry, PolicySet};

/// One directory entry as read by the caller.
#[derive(Debug, Clone)]
pub struct DirFile {
    /// Name inside the directory, e.g. `llama-8b.yaml`.
    pub file_name: String,
    pub modified: SystemTime,
    /// The contents, or why they could not be read.
    pub text: Result<String, String>,
}

/// What was last applied from each file: file name → text. Kept by the caller between reloads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirState {
    applied: BTreeMap<String, String>,
}

/// Start-up refuses an invalid `_default`; a reload keeps the previous global policy instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Startup,
    Reload,
}

/// The result of one pass over the directory.
#[derive(Debug, Clone)]
pub struct DirOutcome {
    pub set: PolicySet,
    pub state: DirState,
    /// Documents applied, removed or reverted, one line each (for the log).
    pub changes: Vec<String>,
    /// Files skipped or refused, one line each naming the file and why (for the log).
    pub refused: Vec<String>,
    /// Warnings of applied documents (valid values that are probably not meant).
    pub warnings: Vec<String>,
}

const DEFAULT_FILES: [&str; 2] = ["_default.yaml", "_default.yml"];

/// The named-document name of a policy file, `None` for a file this directory does not load.
fn stem(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(".yaml")
        .or_else(|| file_name.strip_suffix(".yml"))
}

/// Applies the directory's files to `current`. Fails only at [`Phase::Startup`], for an invalid
/// or unreadable `_default`.
pub fn apply(
    dir: &Path,
    current: &PolicySet,
    state: &DirState,
    files: &[DirFile],
    phase: Phase,
    context: &PolicyContext,
) -> Result<DirOutcome, PolicyError> {
    let mut set = current.clone();
    let mut applied = state.applied.clone();
    let mut changes = Vec::new();
    let mut refused = Vec::new();
    let mut warnings = Vec::new();
    let path_of = |file_name: &str| dir.join(file_name);

    let mut files: Vec<&DirFile> = files
        .iter()
        .filter(|file| stem(&file.file_name).is_some())
        .collect();
    files.sort_by(|a, b| (a.modified, &a.file_name).cmp(&(b.modified, &b.file_name)));
    let present = |file_name: &str| files.iter().any(|file| file.file_name == file_name);

    // Deleted files lose their documents.
    let gone: Vec<String> = applied
        .keys()
        .filter(|file_name| !present(file_name))
        .cloned()
        .collect();
    for file_name in gone {
        applied.remove(&file_name);
        if DEFAULT_FILES.contains(&file_name.as_str()) {
            if !DEFAULT_FILES.iter().any(|other| present(other)) {
                set = set.replace_global(PolicySet::built_in(context).global().clone());
                changes.push(format!(
                    "{}: deleted; the global policy reverts to the built-in least-loaded default",
                    path_of(&file_name).display()
                ));
            }
            continue;
        }
        let Some(name) = stem(&file_name) else {
            continue;
        };
        if set
            .named()
            .get(name)
            .is_some_and(|entry| entry.origin == Origin::File(path_of(&file_name)))
        {
            set = set.remove_named(name);
            changes.push(format!(
                "{}: deleted; named policy {name} removed",
                path_of(&file_name).display()
            ));
        }
    }

    // The global policy.
    let default_file = DEFAULT_FILES
        .iter()
        .find_map(|wanted| files.iter().find(|file| file.file_name == *wanted));
    if let Some(ignored) = files.iter().find(|file| file.file_name == DEFAULT_FILES[1])
        && default_file.is_some_and(|chosen| chosen.file_name == DEFAULT_FILES[0])
    {
        refused.push(format!(
            "{}: ignored, _default.yaml is the global policy",
            path_of(&ignored.file_name).display()
        ));
    }
    let default_changed = |file: &DirFile| match &file.text {
        Err(_) => true,
        Ok(text) => applied.get(&file.file_name) != Some(text),
    };
    if let Some(file) = default_file
        && default_changed(file)
    {
        let path = path_of(&file.file_name);
        let origin = format!("policy file {}", path.display());
        let compiled = match &file.text {
            Err(error) => Err(PolicyError::Invalid {
                origin: origin.clone(),
                problems: super::compile::Problems(vec![super::compile::Problem {
                    field: "file".into(),
                    message: format!("cannot be read: {error}"),
                }]),
            }),
            Ok(text) => compile_text(&origin, text, Role::Global, context),
        };
        match compiled {
            Ok(compiled) => {
                warnings.extend(
                    compiled
                        .warnings
                        .iter()
                        .map(|warning| format!("{origin}: {warning}")),
                );
                set = set.replace_global(PolicyEntry::new(compiled, Origin::File(path.clone())));
                if let Ok(text) = &file.text {
                    applied.insert(file.file_name.clone(), text.clone());
                }
                changes.push(format!("{}: global policy applied", path.display()));
            }
            Err(error) if phase == Phase::Startup => return Err(error),
            Err(error) => refused.push(format!("{error}; the previous global policy stays active")),
        }
    }

    // Named documents, oldest first: compile every changed file, then claim models.
    let mut candidates = Vec::new();
    for file in &files {
        if DEFAULT_FILES.contains(&file.file_name.as_str()) {
            continue;
        }
        let Some(name) = stem(&file.file_name) else {
            continue;
        };
        let path = path_of(&file.file_name);
        let text = match &file.text {
            Ok(text) => text,
            Err(error) => {
                refused.push(format!(
                    "{}: cannot be read: {error}; skipped",
                    path.display()
                ));
                continue;
            }
        };
        if applied.get(&file.file_name) == Some(text) {
            continue; // unchanged: not reapplied
        }
        if name.is_empty() {
            refused.push(format!(
                "{}: has no name before its extension; skipped",
                path.display()
            ));
            continue;
        }
        let origin = format!("policy file {}", path.display());
        match compile_text(&origin, text, Role::Named(name), context) {
            Ok(compiled) => candidates.push(Candidate {
                file_name: &file.file_name,
                name,
                path,
                text,
                compiled,
            }),
            Err(error) => {
                let keeps = if set.named().contains_key(name) {
                    "the previous version stays active"
                } else {
                    "skipped"
                };
                refused.push(format!("{error}; {keeps}"));
            }
        }
    }
    // A file refused for a model conflict is tried again after the files that did apply, since
    // a newer edit may have released the model (at start-up nothing is released, so the older
    // file keeps it). Each round applies at least one file or stops: at most `files` rounds.
    loop {
        let mut conflicted = Vec::new();
        let mut progressed = false;
        for candidate in candidates {
            // Two files with one stem (`a.yaml`, `a.yml`): the first applied keeps the name.
            if let Some(entry) = set.named().get(candidate.name)
                && let Origin::File(other) = &entry.origin
                && *other != candidate.path
                && other
                    .file_name()
                    .and_then(|other| other.to_str())
                    .is_some_and(present)
            {
                refused.push(format!(
                    "{}: named policy {} is already defined by {}; skipped",
                    candidate.path.display(),
                    candidate.name,
                    other.display()
                ));
                continue;
            }
            let entry = PolicyEntry::new(
                candidate.compiled.clone(),
                Origin::File(candidate.path.clone()),
            );
            match set.put_named(candidate.name, entry) {
                Ok(next) => {
                    set = next;
                    progressed = true;
                    applied.insert(candidate.file_name.to_owned(), candidate.text.clone());
                    warnings.extend(candidate.compiled.warnings.iter().map(|warning| {
                        format!("policy file {}: {warning}", candidate.path.display())
                    }));
                    changes.push(format!(
                        "{}: named policy {} applied",
                        candidate.path.display(),
                        candidate.name
                    ));
                }
                Err(conflict) => conflicted.push((candidate, conflict)),
            }
        }
        if !progressed || conflicted.is_empty() {
            refused.extend(conflicted.into_iter().map(|(candidate, conflict)| {
                format!(
                    "{}: {conflict}; the whole file is skipped",
                    candidate.path.display()
                )
            }));
            break;
        }
        candidates = conflicted
            .into_iter()
            .map(|(candidate, _)| candidate)
            .collect();
    }

    Ok(DirOutcome {
        set,
        state: DirState { applied },
        changes,
        refused,
        warnings,
    })
}

/// A changed named file that compiled, waiting to claim its models.
struct Candidate<'a> {
    file_name: &'a str,
    name: &'a str,
    path: std::path::PathBuf,
    text: &'a String,
    compiled: super::compile::Compiled,
}

#[cfg(test)]
mod tests;

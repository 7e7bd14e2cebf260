//! `/admin/policy*` on the control core (admin reference, "Global policy", "Named model
//! policies"):
//!
//! | Route | Answer |
//! | --- | --- |
//! | `GET /admin/policy` | 200, the active global policy as JSON |
//! | `PUT /admin/policy` | 200 `{"status":"policy updated"}`; 400 invalid |
//! | `GET /admin/policy/models` | 200, `{name: document}` (`{}` when none) |
//! | `GET /admin/policy/models/{name}` | 200 document; 404 unknown |
//! | `PUT /admin/policy/models/{name}` | 200 `{"status","name","models"}`; 400 invalid or no models; 409 a model owned by another document |
//! | `DELETE /admin/policy/models/{name}` | 200 `{"status":"policy deleted","name"}`, also when absent |
//!
//! Bodies are YAML (JSON is YAML), at most [`BODY_LIMIT_BYTES`]. Every write is validated whole
//! and checked against existing keys (cross-config serverless invariant) before it is installed;
//! a refusal leaves the active set unchanged. Writes live in memory only: a restart reloads the
//! files. Errors use the admin API's simple `{"error": "..."}` body.

use serde_json::{Value, json};

use crate::logic::policy::{
    Origin, OwnershipConflict, PolicyEntry, Role, check_policy_name, compile_text,
};
use crate::router::control::ControlShared;
use crate::router::control::policies::Trigger;
use crate::router::control::policy_reload::{CommitError, commit};
use crate::router::shard::messages::AdminReply;
use crate::wire::http::request::Method;

/// Largest policy body (admin reference, "Administration request-body limits").
pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;

fn reply(status: u16, value: &Value) -> AdminReply {
    AdminReply {
        status,
        body: serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()),
        stream: None,
    }
}

fn error(status: u16, message: &str) -> AdminReply {
    reply(status, &json!({ "error": message }))
}

fn document_json(entry: &PolicyEntry) -> Value {
    serde_json::to_value(&*entry.document).unwrap_or(Value::Null)
}

/// `path` is the request path without its query.
pub fn handle(shared: &ControlShared, method: Method, path: &str, body: &[u8]) -> AdminReply {
    if path == "/admin/policy" {
        return match method {
            Method::Get => reply(200, &document_json(shared.policies.current().global())),
            Method::Put => put_global(shared, body),
            _ => error(405, "method not allowed for this admin route"),
        };
    }
    if path == "/admin/policy/models" || path == "/admin/policy/models/" {
        return match method {
            Method::Get => {
                let set = shared.policies.current();
                let listed: serde_json::Map<String, Value> = set
                    .named()
                    .iter()
                    .map(|(name, entry)| (name.clone(), document_json(entry)))
                    .collect();
                reply(200, &Value::Object(listed))
            }
            _ => error(405, "method not allowed for this admin route"),
        };
    }
    let Some(raw_name) = path.strip_prefix("/admin/policy/models/") else {
        return error(404, "no such admin route");
    };
    let name = match percent_decode(raw_name) {
        Some(name) => name,
        None => return error(400, "policy name is not valid percent-encoded UTF-8"),
    };
    match method {
        Method::Get => match shared.policies.current().named().get(&name) {
            Some(entry) => reply(200, &document_json(entry)),
            None => error(404, &format!("no named policy {name:?}")),
        },
        Method::Put => put_named(shared, &name, body),
        Method::Delete => delete_named(shared, &name),
        _ => error(405, "method not allowed for this admin route"),
    }
}

fn body_text(body: &[u8]) -> Result<&str, AdminReply> {
    if body.len() > BODY_LIMIT_BYTES {
        return Err(error(
            400,
            &format!(
                "request body is {} bytes, over the {BODY_LIMIT_BYTES}-byte limit for policies",
                body.len()
            ),
        ));
    }
    std::str::from_utf8(body).map_err(|_| error(400, "policy body is not UTF-8 text"))
}

fn keys_refusal(problems: &crate::logic::auth::config::Problems) -> AdminReply {
    error(
        400,
        &format!("policy would invalidate existing API keys: {problems}"),
    )
}

fn put_global(shared: &ControlShared, body: &[u8]) -> AdminReply {
    let text = match body_text(body) {
        Ok(text) => text,
        Err(refusal) => return refusal,
    };
    let compiled = match compile_text(
        "PUT /admin/policy",
        text,
        Role::Global,
        &shared.policies.context,
    ) {
        Ok(compiled) => compiled,
        Err(problem) => {
            shared.policies.count_reload(Trigger::Api, false);
            return error(400, &problem.to_string());
        }
    };
    let warnings = compiled.warnings.clone();
    let result = commit(shared, |current| {
        Ok::<_, std::convert::Infallible>((
            current.replace_global(PolicyEntry::new(compiled, Origin::Api)),
            (),
        ))
    });
    match result {
        Ok(_) => {
            shared.policies.count_reload(Trigger::Api, true);
            tracing::info!("global policy replaced through the admin API (until restart)");
            for warning in &warnings {
                tracing::warn!("PUT /admin/policy: {warning}");
            }
            reply(200, &json!({ "status": "policy updated" }))
        }
        Err(CommitError::Build(never)) => match never {},
        Err(CommitError::Keys(problems)) => {
            shared.policies.count_reload(Trigger::Api, false);
            keys_refusal(&problems)
        }
    }
}

fn put_named(shared: &ControlShared, name: &str, body: &[u8]) -> AdminReply {
    if let Err(message) = check_policy_name(name) {
        return error(400, &message);
    }
    let text = match body_text(body) {
        Ok(text) => text,
        Err(refusal) => return refusal,
    };
    let origin = format!("PUT /admin/policy/models/{name}");
    let compiled = match compile_text(&origin, text, Role::Named(name), &shared.policies.context) {
        Ok(compiled) => compiled,
        Err(problem) => {
            shared.policies.count_reload(Trigger::Api, false);
            return error(400, &problem.to_string());
        }
    };
    let models = compiled.document.models.clone();
    let warnings = compiled.warnings.clone();
    let result = commit(shared, |current| {
        current
            .put_named(name, PolicyEntry::new(compiled, Origin::Api))
            .map(|set| (set, ()))
    });
    match result {
        Ok(_) => {
            shared.policies.count_reload(Trigger::Api, true);
            tracing::info!(
                name,
                ?models,
                "named policy written through the admin API (until restart)"
            );
            for warning in &warnings {
                tracing::warn!("PUT /admin/policy/models/{name}: {warning}");
            }
            reply(
                200,
                &json!({ "status": "policy updated", "name": name, "models": models }),
            )
        }
        Err(CommitError::Build(OwnershipConflict { model, owner })) => {
            shared.policies.count_reload(Trigger::Api, false);
            error(
                409,
                &format!("model {model:?} already belongs to named policy {owner:?}"),
            )
        }
        Err(CommitError::Keys(problems)) => {
            shared.policies.count_reload(Trigger::Api, false);
            keys_refusal(&problems)
        }
    }
}

fn delete_named(shared: &ControlShared, name: &str) -> AdminReply {
    let deleted = json!({ "status": "policy deleted", "name": name });
    if !shared.policies.current().named().contains_key(name) {
        return reply(200, &deleted); // idempotent
    }
    // Models return to the global policy, which may be serverless with a cap some key cannot
    // meet: checked like any other change.
    let result = commit(shared, |current| {
        Ok::<_, std::convert::Infallible>((current.remove_named(name), ()))
    });
    match result {
        Ok(_) => {
            shared.policies.count_reload(Trigger::Api, true);
            tracing::info!(
                name,
                "named policy deleted through the admin API (until restart)"
            );
            reply(200, &deleted)
        }
        Err(CommitError::Build(never)) => match never {},
        Err(CommitError::Keys(problems)) => {
            shared.policies.count_reload(Trigger::Api, false);
            keys_refusal(&problems)
        }
    }
}

/// `%XX` escapes in a path segment; `None` for a malformed escape or non-UTF-8 result.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = segment.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(percent_decode("gpt-oss").as_deref(), Some("gpt-oss"));
        assert_eq!(percent_decode("a%20b").as_deref(), Some("a b"));
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}

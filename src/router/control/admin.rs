//! The admin API's control-core side: dynamic client keys (`/admin/api-keys/*`). Every write is
//! validated by `auth::dynamic` and refused with 400 and a reason, leaving the registry unchanged;
//! a successful write publishes a new key snapshot to every shard before it is acknowledged.
//!
//! Routes (admin reference): `GET /admin/api-keys`, `GET /admin/api-keys/version`,
//! `GET|PUT|DELETE /admin/api-keys/{id}` (`DELETE ...?version=`), `POST /admin/api-keys/replace`,
//! and `GET /admin/health`. With `api.mode` other than `dynamic`, key routes answer 501.
//! Registry views and operations (`registry_route`): `GET /admin/models`,
//! `GET /admin/models/{model}`, `GET /admin/routing-table` (built by `admin_views`),
//! `GET /admin/registration-stream` (a subscription the shard streams), `GET /admin/storage` and
//! `POST /admin/metrics/reset`.
//! `/admin/policy*` is served by `admin_policy`. Key writes are checked against the active
//! routing policies' serverless limits.
//!
//! Every request body is checked against the document shape limits (`doc_guard`: nesting depth,
//! YAML alias expansion) before any route parses it: YAML for `/admin/policy*`, JSON elsewhere;
//! over a limit is 400 with the reason. [`handle`] runs on a blocking thread, one call at a time
//! (`control::start`), never on the control core's own thread, which serves agent gRPC and
//! `/metrics`.

use std::sync::Arc;

use serde::Serialize;

use crate::logic::auth::dynamic::{DynamicError, ErrorResponse, PutKeyRequest, ReplaceRequest};
use crate::router::control::ControlShared;
use crate::router::shard::messages::{AdminReply, ControlToShard};
use crate::wire::http::request::Method;

fn json(status: u16, value: &impl Serialize) -> AdminReply {
    AdminReply {
        status,
        body: serde_json::to_vec(value).expect("admin responses serialize"),
        stream: None,
    }
}

fn error(status: u16, message: &str) -> AdminReply {
    json(
        status,
        &ErrorResponse {
            error: message.to_owned(),
            current_version: None,
        },
    )
}

fn refused(problem: &DynamicError) -> AdminReply {
    json(problem.status(), &problem.response())
}

/// Splits `/path?query` and returns the `version` query parameter, if any.
fn split_target(target: &[u8]) -> (&str, Option<String>) {
    let target = std::str::from_utf8(target).unwrap_or("");
    match target.split_once('?') {
        None => (target, None),
        Some((path, query)) => {
            let version = query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| *name == "version")
                .map(|(_, value)| value.to_owned());
            (path, version)
        }
    }
}

/// The shape limits for an admin request body, before its route parses it.
fn check_body_shape(path: &str, body: &[u8]) -> Result<(), String> {
    if body.is_empty() {
        return Ok(());
    }
    let checked = if path == "/admin/policy" || path.starts_with("/admin/policy/") {
        // Policy bodies are YAML; one that is not UTF-8 is refused by its route.
        match std::str::from_utf8(body) {
            Ok(text) => crate::base::doc_guard::check_yaml(text),
            Err(_) => Ok(()),
        }
    } else {
        crate::base::doc_guard::check_json(body)
    };
    checked.map_err(|problem| format!("request body refused: {problem}"))
}

pub fn handle(shared: &ControlShared, method: Method, target: &[u8], body: &[u8]) -> AdminReply {
    let (path, version) = split_target(target);
    if let Err(message) = check_body_shape(path, body) {
        return error(400, &message);
    }
    if path == "/admin/health" && method == Method::Get {
        return json(200, &serde_json::json!({"status": "ok"}));
    }
    if path == "/admin/policy" || path.starts_with("/admin/policy/") {
        return super::admin_policy::handle(shared, method, path, body);
    }
    if let Some(reply) = registry_route(shared, method, path) {
        return reply;
    }
    if path == "/admin/sibling-map" {
        return sibling_map(shared, method, body);
    }
    let Some(rest) = path.strip_prefix("/admin/api-keys") else {
        return error(404, "no such admin route");
    };
    let Some(registry) = &shared.dynamic_keys else {
        return json(501, &ErrorResponse::not_active());
    };
    let mut registry = registry.lock().expect("dynamic key registry lock poisoned");
    // Read under the registry lock: a policy change takes this lock before checking keys, so
    // this write and a policy change cannot each pass against the other's old state.
    let limits = shared.policies.serverless_limits();
    let written = match (method, rest) {
        (Method::Get, "") => return json(200, &registry.list()),
        (Method::Get, "/version") => return json(200, &registry.version_response()),
        (Method::Post, "/replace") => {
            match ReplaceRequest::from_json(body)
                .and_then(|request| registry.replace(request, &limits))
            {
                Ok(count) => {
                    serde_json::json!({"status": "ok", "count": count, "version": registry.version()})
                }
                Err(problem) => return refused(&problem),
            }
        }
        (method, id) if id.starts_with('/') && id.len() > 1 && !id[1..].contains('/') => {
            let id = &id[1..];
            match method {
                Method::Get => {
                    return match registry.get(id) {
                        Ok(found) => json(200, &found),
                        Err(problem) => refused(&problem),
                    };
                }
                Method::Put => match PutKeyRequest::from_json(body)
                    .and_then(|request| registry.put(id, request, &limits))
                {
                    Ok(()) => {
                        serde_json::json!({"status": "ok", "id": id, "version": registry.version()})
                    }
                    Err(problem) => return refused(&problem),
                },
                Method::Delete => match registry.delete(id, version.as_deref()) {
                    Ok(()) => {
                        serde_json::json!({"status": "ok", "id": id, "version": registry.version()})
                    }
                    Err(problem) => return refused(&problem),
                },
                _ => return error(405, "method not allowed for this admin route"),
            }
        }
        _ => return error(404, "no such admin route"),
    };
    // Publish before acknowledging: by the time a client reads "ok", every shard has the new
    // snapshot queued in its inbox (applied within microseconds, in order with earlier ones).
    let snapshot = registry.snapshot();
    tracing::info!(
        keys = snapshot.len(),
        version = registry.version(),
        "dynamic keys changed"
    );
    shared.broadcast_blocking(|| ControlToShard::Keys(snapshot.clone()));
    json(200, &written)
}

/// The read-only registry views, the registration stream, storage and metrics reset; `None`
/// for any other path.
fn registry_route(shared: &ControlShared, method: Method, path: &str) -> Option<AdminReply> {
    use super::admin_views;
    let views = || {
        shared
            .registry()
            .agent_views(std::time::Instant::now(), crate::base::clock::now_unix_ms())
    };
    let (allowed, reply): (Method, &dyn Fn() -> AdminReply) = match path {
        "/admin/models" => (Method::Get, &|| json(200, &admin_views::models(&views()))),
        "/admin/routing-table" => (Method::Get, &|| {
            json(200, &admin_views::routing_table(&views()))
        }),
        "/admin/registration-stream" => (Method::Get, &|| registration_stream(shared)),
        "/admin/storage" => (Method::Get, &storage),
        "/admin/metrics/reset" => (Method::Post, &|| metrics_reset(shared)),
        _ => {
            let name = path.strip_prefix("/admin/models/")?;
            let name = percent_decode(name);
            return Some(match method {
                Method::Get => match admin_views::model(&views(), &name) {
                    Some(found) => json(200, &found),
                    None => error(404, &format!("model not found: {name}")),
                },
                _ => error(405, "method not allowed for this admin route"),
            });
        }
    };
    Some(if method == allowed {
        reply()
    } else {
        error(405, "method not allowed for this admin route")
    })
}

/// `GET /admin/registration-stream`: a subscription to the registration feed, streamed by the
/// shard (`api::admin`), or `503` when [`registration_feed::SUBSCRIBERS_MAX`] streams are open.
///
/// [`registration_feed::SUBSCRIBERS_MAX`]: crate::router::shard::registration_feed::SUBSCRIBERS_MAX
fn registration_stream(shared: &ControlShared) -> AdminReply {
    match shared.registrations.subscribe() {
        Ok(subscription) => AdminReply {
            status: 200,
            body: Vec::new(),
            stream: Some(subscription),
        },
        Err(_) => error(503, "too many registration-stream subscribers, retry later"),
    }
}

/// `GET /admin/storage`. The reference's fields describe BadgerDB (LSM tree, value log, its
/// garbage collector); this router's disk database is redb (`disk_db`), which has none of them,
/// so it gives the answer the reference documents for another storage backend: `200` with
/// `{"error": "storage stats not available for this backend"}`.
fn storage() -> AdminReply {
    error(200, "storage stats not available for this backend")
}

/// `POST /admin/metrics/reset`: the per-agent lifetime counters (successes, failures, tokens,
/// disconnections, heartbeat failures, rejections, resets, SRTT/RTTVAR) back to zero, and the
/// series of agents not registered now gone (`control::registry::history`); with the disk
/// database, the next flush (within a second) writes the zeros and deletes the records of the
/// agents forgotten, and the message names the disk as the reference's does. Tenant quotas and
/// router-level counters are untouched, as the reference says.
fn metrics_reset(shared: &ControlShared) -> AdminReply {
    shared.registry().reset_agent_history();
    let message = if shared.settings.history_on_disk {
        "per-agent lifetime counters cleared (disk, in-memory, and Prometheus series)"
    } else {
        "per-agent lifetime counters cleared (in-memory and Prometheus series)"
    };
    json(
        200,
        &serde_json::json!({
            "status": "metrics reset",
            "message": message,
        }),
    )
}

/// `%XX` escapes decoded (a model ID in a path may carry them, as the models reference says);
/// a malformed escape is kept as written. The result is UTF-8, lossily.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET|PUT /admin/sibling-map`: the map writer pushes the whole map; an invalid value refuses
/// the whole push (400 with the reason) and keeps the active map. The map lives in memory only.
fn sibling_map(shared: &ControlShared, method: Method, body: &[u8]) -> AdminReply {
    use crate::logic::sibling::map::{MapRules, SiblingMap};
    let Some(site) = &shared.settings.site else {
        return error(
            501,
            "cross-site redirect is off: start the router with --site-id to accept a sibling map",
        );
    };
    match method {
        Method::Get => match shared.registry().siblings() {
            Some(siblings) => AdminReply {
                status: 200,
                body: siblings.map.to_json(),
                stream: None,
            },
            None => error(
                404,
                "no sibling map has been pushed since this router started",
            ),
        },
        Method::Put => {
            let rules = MapRules {
                local_site: site.id.clone(),
                allowed_domains: site.allowed_domains.clone(),
            };
            let map = match SiblingMap::parse(body, &rules) {
                Ok(map) => Arc::new(map),
                Err(problem) => return error(400, &problem.to_string()),
            };
            let (sites, placements) = (map.sites().len(), map.placements().len());
            let held_here = map.held_here(&site.id).len();
            // Built and queued in one publishing turn, like every snapshot publication (shards
            // see them in the order they were built).
            let publishing = shared.publishing_blocking();
            let snapshot = {
                let mut registry = shared.registry();
                registry.set_siblings(crate::router::control::registry::Siblings {
                    map,
                    local_site: site.id.clone(),
                    default_budget: site.default_hold_budget,
                });
                registry.snapshot(&shared.policies.current())
            };
            publishing.broadcast_blocking(|| ControlToShard::Snapshot(snapshot.clone()));
            drop(publishing);
            tracing::info!(sites, placements, held_here, "sibling map installed");
            json(
                200,
                &serde_json::json!({
                    "status": "ok",
                    "sites": sites,
                    "placements": placements,
                    "held_here": held_here,
                }),
            )
        }
        _ => error(405, "method not allowed for this admin route"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_checked_as_yaml_or_json_by_route() {
        let deep_json = format!("{{\"a\": {}1{}}}", "[".repeat(65), "]".repeat(65));
        let refused = check_body_shape("/admin/api-keys/a", deep_json.as_bytes()).unwrap_err();
        assert_eq!(
            refused,
            "request body refused: nesting deeper than 64 levels (line 1)"
        );
        let deep_yaml = format!("shed_if:\n  - {}1{}\n", "[".repeat(70), "]".repeat(70));
        let refused = check_body_shape("/admin/policy", deep_yaml.as_bytes()).unwrap_err();
        assert!(refused.contains("(line 2)"), "{refused}");
        assert!(check_body_shape("/admin/policy/models/a", b"models: [a]\n").is_ok());
        assert!(check_body_shape("/admin/sibling-map", b"").is_ok());
        // Brackets in a YAML block scalar are text, not nesting.
        let text = format!("description: |\n  {}\n", "[".repeat(100));
        assert!(check_body_shape("/admin/policy", text.as_bytes()).is_ok());
    }

    #[test]
    fn model_ids_in_paths_are_percent_decoded() {
        assert_eq!(
            percent_decode("Qwen/Qwen3.6-27B-A3B"),
            "Qwen/Qwen3.6-27B-A3B"
        );
        assert_eq!(percent_decode("my%20model%2Fv1"), "my model/v1");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("a%zzb%4"), "a%zzb%4");
    }

    #[test]
    fn targets_split_into_path_and_version() {
        assert_eq!(
            split_target(b"/admin/api-keys/a"),
            ("/admin/api-keys/a", None)
        );
        assert_eq!(
            split_target(b"/admin/api-keys/a?x=1&version=rev_00000003"),
            ("/admin/api-keys/a", Some("rev_00000003".to_owned()))
        );
    }
}

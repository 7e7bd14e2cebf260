//! `/admin/*` on the client port: admin authentication on the shard (constant-time hash compare,
//! `HIVENET_ROUTER_ADMIN_API_KEYS`), then the request goes to the control core, which owns every
//! admin-writable registry and serialises writes; the answer comes back to this shard.
//!
//! The admin key is accepted only as `Authorization: Bearer <key>`, the form the admin reference
//! documents (client keys may also come raw or in `x-api-key`; admin keys may not). A missing or
//! wrong credential is the reference's 401: the `unauthorized` envelope with
//! `WWW-Authenticate: Bearer realm="hivenet-router"`. Other admin responses use the simpler
//! `{"error": "..."}` form the admin reference documents.

use std::rc::Rc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::api::ClientRequest;
use crate::api::sink::{ClientGone, Sink};
use crate::auth::keys::bearer_token;
use crate::control::queues::QueueError;
use crate::error::Rejection;
use crate::shard::messages::AdminCall;
use crate::shard::state::Shard;

/// How long an admin call may wait for the control core.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    sink: &mut S,
) -> Result<(), ClientGone> {
    let presented = bearer_token(request.authorization.as_deref());
    if !shard.admin_access().authorize(presented) {
        return sink.reject(&Rejection::unauthorized("unauthorized")).await;
    }
    let (reply, answer) = oneshot::channel();
    let call = AdminCall {
        method: request.method,
        target: request.target.clone(),
        body: request.body.clone(),
        reply,
    };
    if let Err(error) = shard.call_control(call) {
        let body: &[u8] = match error {
            QueueError::Full(_) => b"{\"error\":\"control core busy, retry later\"}",
            QueueError::Closed(_) => b"{\"error\":\"control core unavailable\"}",
        };
        return sink.respond(503, "application/json", &[], body).await;
    }
    match sink
        .until_client_gone(monoio::time::timeout(CONTROL_TIMEOUT, answer))
        .await
    {
        None => Err(ClientGone),
        Some(Ok(Ok(reply))) => {
            sink.respond(reply.status, "application/json", &[], &reply.body)
                .await
        }
        Some(_) => {
            sink.respond(
                503,
                "application/json",
                &[],
                b"{\"error\":\"control core did not answer\"}",
            )
            .await
        }
    }
}

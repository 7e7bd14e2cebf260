//! `/admin/*` on the client port: admin authentication on the shard (constant-time hash compare,
//! `HIVENET_ROUTER_ADMIN_API_KEYS`), then the request goes to the control core, which owns every
//! admin-writable registry and serialises writes; the answer comes back to this shard.
//!
//! The admin key is accepted only as `Authorization: Bearer <key>`, the form the admin reference
//! documents (client keys may also come raw or in `x-api-key`; admin keys may not). A missing or
//! wrong credential is the reference's 401: the `unauthorized` envelope with
//! `WWW-Authenticate: Bearer realm="hivenet-router"`. Other admin responses use the simpler
//! `{"error": "..."}` form the admin reference documents.
//!
//! One answer is a stream: `GET /admin/registration-stream` comes back from the control core as a
//! subscription to the registration feed (`shard::registration_feed`), and this shard writes it
//! as Server-Sent Events: each change as it comes, a keepalive comment every
//! [`KEEPALIVE_INTERVAL`], a comment saying how many events a slow reader missed, and the end of
//! the stream after [`STREAM_LIFETIME_MAX`], or once the router is draining (at its next event or
//! keepalive, and at the latest when the drain ends the requests still open); the client
//! reconnects and resynchronises from `/admin/routing-table`, as the reference advises.

use std::rc::Rc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::logic::auth::keys::bearer_token;
use crate::router::api::request::ClientRequest;
use crate::router::api::sink::{ClientGone, Sink};
use crate::router::error::Rejection;
use crate::router::shard::messages::AdminCall;
use crate::router::shard::queues::QueueError;
use crate::router::shard::registration_feed::Subscription;
use crate::router::shard::state::Shard;

/// How long an admin call may wait for the control core.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// An idle registration stream gets an SSE comment this often (the reference: 25 seconds), so
/// proxies and clients keep the connection.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(25);

/// A registration stream ends after this long: a bound on how long one admin request holds a
/// connection and a place among the feed's subscribers.
const STREAM_LIFETIME_MAX: Duration = Duration::from_secs(3600);

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
        Some(Ok(Ok(reply))) => match reply.stream {
            Some(subscription) => stream_registrations(shard, subscription, sink).await,
            None => {
                sink.respond(reply.status, "application/json", &[], &reply.body)
                    .await
            }
        },
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

/// Writes a registration-feed subscription as Server-Sent Events until the client goes, the
/// router drains or [`STREAM_LIFETIME_MAX`] passes.
async fn stream_registrations<S: Sink>(
    shard: &Rc<Shard>,
    mut subscription: Subscription,
    sink: &mut S,
) -> Result<(), ClientGone> {
    use futures_util::future::{Either, select};
    use tokio::sync::broadcast::error::RecvError;

    sink.start_stream(
        200,
        "text/event-stream",
        &[("cache-control", b"no-cache".as_slice())],
    )
    .await?;
    // A first comment: the client knows at once that the subscription is live.
    sink.stream_data(b": registration stream open\n\n").await?;
    let started = monoio::time::Instant::now();
    while !shard.lifecycle.is_draining() {
        let Some(left) = STREAM_LIFETIME_MAX.checked_sub(started.elapsed()) else {
            break;
        };
        let next = monoio::time::timeout(KEEPALIVE_INTERVAL.min(left), subscription.frames.recv());
        let ending = shard.lifecycle.ending();
        let (next, ending) = (std::pin::pin!(next), std::pin::pin!(ending));
        let next = sink.until_client_gone(select(next, ending)).await;
        match next {
            None => return Err(ClientGone),
            Some(Either::Right(_)) => break,
            Some(Either::Left((Err(_idle), _))) => {
                if started.elapsed() < STREAM_LIFETIME_MAX {
                    sink.stream_data(b": keepalive\n\n").await?;
                }
            }
            Some(Either::Left((Ok(Ok(frame)), _))) => sink.stream_data(&frame).await?,
            Some(Either::Left((Ok(Err(RecvError::Lagged(missed))), _))) => {
                let notice =
                    format!(": missed {missed} events, resync from /admin/routing-table\n\n");
                sink.stream_data(notice.as_bytes()).await?;
            }
            Some(Either::Left((Ok(Err(RecvError::Closed)), _))) => break,
        }
    }
    sink.end_stream().await
}

use super::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

/// A router end and an agent end over an in-memory pipe, their connections polled in tasks.
fn pair(
    windows: Windows,
) -> (
    Opener,
    Acceptor,
    tokio::task::JoinHandle<Result<(), LinkError>>,
) {
    let (router_io, agent_io) = tokio::io::duplex(16 * 1024);
    let (opener, router_connection) = client_with_windows(router_io, windows);
    let (acceptor, agent_connection) = server_with_windows(agent_io, windows);
    tokio::spawn(router_connection);
    let agent = tokio::spawn(agent_connection);
    (opener, acceptor, agent)
}

fn target() -> PathAndQuery {
    PathAndQuery::from_static("/v1/chat/completions")
}

async fn read_all(body: &mut RecvStream) -> Result<Vec<u8>, LinkError> {
    let mut whole = Vec::new();
    while let Some(data) = tokio::time::timeout(WAIT, body.data()).await.unwrap() {
        let data = data?;
        body.release_capacity(data.len());
        whole.extend_from_slice(&data);
    }
    Ok(whole)
}

#[tokio::test]
async fn bodies_larger_than_the_windows_cross_both_ways_and_leave_no_state() {
    let windows = Windows {
        stream: 1024,
        connection: 4096,
    };
    let (opener, mut acceptor, _agent) = pair(windows);
    let prompt = Bytes::from((0..50_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let answer: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
    let mut fields = HeaderMap::new();
    fields.insert("x-request-id", "r-1".parse().unwrap());
    let response = opener
        .send_request(Method::POST, target(), fields, prompt.clone())
        .unwrap();
    let agent_side = {
        let answer = answer.clone();
        tokio::spawn(async move {
            let (request, mut body, mut responder) = acceptor.accept().await.unwrap();
            assert_eq!(request.method, Method::POST);
            assert_eq!(request.fields["x-request-id"], "r-1");
            let received = read_all(&mut body).await.unwrap();
            let mut fields = HeaderMap::new();
            fields.insert("content-type", "application/json".parse().unwrap());
            responder
                .send_response(StatusCode::OK, fields, false)
                .unwrap();
            for piece in answer.chunks(10_000) {
                let last = piece.as_ptr_range().end == answer.as_ptr_range().end;
                responder
                    .send_data(Bytes::copy_from_slice(piece), last)
                    .await
                    .unwrap();
            }
            (received, acceptor)
        })
    };
    let mut response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.fields["content-type"], "application/json");
    assert_eq!(read_all(&mut response.body).await.unwrap(), answer);
    let (received, acceptor) = agent_side.await.unwrap();
    assert_eq!(received, prompt);
    drop(response);
    tokio::task::yield_now().await;
    for shared in [&opener.shared, &acceptor.shared] {
        let inner = lock(shared);
        assert!(inner.streams.is_empty());
        assert_eq!(inner.mux.open_streams(), 0);
    }
}

#[tokio::test]
async fn a_body_dropped_midway_resets_the_stream_for_the_agent() {
    let (opener, mut acceptor, _agent) = pair(Windows::TUNNEL);
    let response = opener
        .send_request(Method::POST, target(), HeaderMap::new(), Bytes::new())
        .unwrap();
    let (_, _, mut responder) = acceptor.accept().await.unwrap();
    responder
        .send_response(StatusCode::OK, HeaderMap::new(), false)
        .unwrap();
    responder
        .send_data(Bytes::from_static(b"data: 1\n\n"), false)
        .await
        .unwrap();
    let mut response = response.await.unwrap();
    assert!(response.body.data().await.unwrap().is_ok());
    // The router's client left.
    drop(response);
    let reason = tokio::time::timeout(WAIT, std::future::poll_fn(|cx| responder.poll_reset(cx)))
        .await
        .unwrap();
    assert_eq!(
        reason,
        LinkError::Reset {
            reason: CANCEL,
            remote: true
        }
    );
    assert!(
        responder
            .send_data(Bytes::from_static(b"x"), false)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_reset_after_the_head_reaches_the_router_as_the_agent_s() {
    use crate::net::tunnel::BACKEND_FAILED;
    let (opener, mut acceptor, _agent) = pair(Windows::TUNNEL);
    let response = opener
        .send_request(
            Method::POST,
            target(),
            HeaderMap::new(),
            Bytes::from_static(b"{}"),
        )
        .unwrap();
    let (_, _, mut responder) = acceptor.accept().await.unwrap();
    responder
        .send_response(StatusCode::OK, HeaderMap::new(), false)
        .unwrap();
    responder.send_reset(BACKEND_FAILED);
    let mut response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    let error = read_all(&mut response.body).await.unwrap_err();
    assert!(error.is_reset_by_peer(BACKEND_FAILED), "{error:?}");
}

#[tokio::test]
async fn a_lost_connection_fails_every_open_stream_and_new_ones() {
    let (opener, acceptor, agent) = pair(Windows::TUNNEL);
    let response = opener
        .send_request(Method::POST, target(), HeaderMap::new(), Bytes::new())
        .unwrap();
    // The agent goes: its connection and its end of the pipe.
    agent.abort();
    drop(acceptor);
    let failed = tokio::time::timeout(WAIT, response).await.unwrap();
    assert!(
        matches!(failed, Err(LinkError::Closed)),
        "{:?}",
        failed.err()
    );
    assert!(matches!(
        opener.send_request(Method::GET, target(), HeaderMap::new(), Bytes::new()),
        Err(LinkError::Closed)
    ));
}

#[tokio::test]
async fn a_ping_is_answered() {
    let (opener, _acceptor, _agent) = pair(Windows::TUNNEL);
    tokio::time::timeout(WAIT, opener.pinger().ping())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(WAIT, opener.pinger().ping())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn letting_go_of_the_last_opener_closes_the_tunnel_once_its_streams_end() {
    let (opener, mut acceptor, agent) = pair(Windows::TUNNEL);
    let response = opener
        .send_request(Method::POST, target(), HeaderMap::new(), Bytes::from("x"))
        .unwrap();
    let (_request, _body, mut responder) = tokio::time::timeout(WAIT, acceptor.accept())
        .await
        .unwrap()
        .unwrap();
    let clone = opener.clone();
    drop(opener);
    drop(clone);
    // A stream is still open: the tunnel stays for it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!agent.is_finished());
    responder
        .send_response(StatusCode::OK, HeaderMap::new(), false)
        .unwrap();
    tokio::time::timeout(WAIT, responder.send_data(Bytes::from("answer"), true))
        .await
        .unwrap()
        .unwrap();
    let mut response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    assert_eq!(read_all(&mut response.body).await.unwrap(), b"answer");
    drop(response);
    // The agent reads the close as the router closing the tunnel.
    let ended = tokio::time::timeout(WAIT, agent).await.unwrap().unwrap();
    assert_eq!(ended, Ok(()));
}

#[tokio::test]
async fn dropping_the_connection_fails_every_open_stream() {
    let (router_io, agent_io) = tokio::io::duplex(16 * 1024);
    let (opener, router_connection) = client(router_io);
    let (mut acceptor, agent_connection) = server(agent_io);
    let router = tokio::spawn(router_connection);
    tokio::spawn(agent_connection);
    let response = opener
        .send_request(Method::POST, target(), HeaderMap::new(), Bytes::new())
        .unwrap();
    let (_request, _body, mut responder) = tokio::time::timeout(WAIT, acceptor.accept())
        .await
        .unwrap()
        .unwrap();
    responder
        .send_response(StatusCode::OK, HeaderMap::new(), false)
        .unwrap();
    let mut response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    // The router's drain deadline: its connection future is dropped, not ended.
    router.abort();
    let error = read_all(&mut response.body).await.unwrap_err();
    assert_eq!(error, LinkError::Closed);
}

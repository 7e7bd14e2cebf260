//! One tunnelled exchange, both ends in one process over an in-memory pipe: HTTP/2 (`h2`, the
//! tunnel before the lean codec, still spoken with older agents) against the lean codec
//! (`tunnel::link`). The request is
//! the router's (POST, `content-type`, a never-indexed `x-request-id`, a 300-byte body), the
//! answer an agent's (200, `content-type`, `content-length`, a 400-byte body). Both ends run
//! on one current-thread runtime, as each runs on one thread in production, so the figure is
//! the two ends' CPU for one exchange, without the kernel.
//!
//! First runs (`cargo bench --bench tunnel -- --warm-up-time 2 --measurement-time 5`, three in
//! a row on a shared 2-core machine): h2 9.59 / 12.89 / 14.01 µs, lean 5.92 / 7.32 / 7.66 µs per
//! exchange: 0.62, 0.57 and 0.55 of h2's time.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use hivenet_router::net::tunnel::link;
use http::header::{HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, StatusCode};

const REQUEST_ID: &str = "5f0c6a1e-8b2d-4c3f-9a7e-1d2b3c4d5e6f";

fn request_body() -> Bytes {
    Bytes::from(vec![b'x'; 300])
}

fn answer() -> Bytes {
    Bytes::from(vec![b'y'; 400])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn h2_exchange(c: &mut Criterion) {
    let runtime = runtime();
    let mut send = runtime.block_on(async {
        let (router_io, agent_io) = tokio::io::duplex(256 * 1024);
        tokio::spawn(async move {
            let mut connection = h2::server::handshake(agent_io).await.expect("handshake");
            while let Some(Ok((request, mut respond))) = connection.accept().await {
                tokio::spawn(async move {
                    let mut body = request.into_body();
                    while let Some(Ok(data)) = body.data().await {
                        let _ = body.flow_control().release_capacity(data.len());
                    }
                    let response = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/json")
                        .header("content-length", "400")
                        .body(())
                        .expect("a response");
                    let mut send = respond.send_response(response, false).expect("head");
                    let _ = send.send_data(answer(), true);
                });
            }
        });
        let (send, connection) = h2::client::handshake(router_io).await.expect("handshake");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        send
    });
    c.bench_function("tunnel exchange, h2", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut request = http::Request::new(());
                *request.method_mut() = Method::POST;
                *request.uri_mut() = "http://agent/v1/chat/completions".parse().expect("a URI");
                let mut id = HeaderValue::from_static(REQUEST_ID);
                id.set_sensitive(true);
                request
                    .headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/json"));
                request.headers_mut().insert("x-request-id", id);
                send = send.clone().ready().await.expect("ready");
                let (response, mut body) = send.send_request(request, false).expect("sent");
                body.send_data(request_body(), true).expect("body");
                let response = response.await.expect("answer");
                let mut body = response.into_body();
                while let Some(Ok(data)) = body.data().await {
                    let _ = body.flow_control().release_capacity(data.len());
                    black_box(data);
                }
            })
        })
    });
}

fn lean_exchange(c: &mut Criterion) {
    let runtime = runtime();
    let opener = runtime.block_on(async {
        let (router_io, agent_io) = tokio::io::duplex(256 * 1024);
        let (mut acceptor, agent_connection) = link::server(agent_io);
        tokio::spawn(agent_connection);
        tokio::spawn(async move {
            while let Some((_request, mut body, mut responder)) = acceptor.accept().await {
                tokio::spawn(async move {
                    while let Some(Ok(data)) = body.data().await {
                        body.release_capacity(data.len());
                    }
                    let mut fields = HeaderMap::new();
                    fields.insert("content-type", HeaderValue::from_static("application/json"));
                    fields.insert("content-length", HeaderValue::from_static("400"));
                    responder
                        .send_response(StatusCode::OK, fields, false)
                        .expect("head");
                    let _ = responder.send_data(answer(), true).await;
                });
            }
        });
        let (opener, router_connection) = link::client(router_io);
        tokio::spawn(router_connection);
        opener
    });
    c.bench_function("tunnel exchange, lean", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut fields = HeaderMap::new();
                fields.insert("content-type", HeaderValue::from_static("application/json"));
                fields.insert("x-request-id", HeaderValue::from_static(REQUEST_ID));
                let response = opener
                    .send_request(
                        Method::POST,
                        PathAndQuery::from_static("/v1/chat/completions"),
                        fields,
                        request_body(),
                    )
                    .expect("sent");
                let mut response = response.await.expect("answer");
                while let Some(Ok(data)) = response.body.data().await {
                    response.body.release_capacity(data.len());
                    black_box(data);
                }
            })
        })
    });
}

criterion_group!(benches, h2_exchange, lean_exchange);
criterion_main!(benches);

//! Proves TLS on the data tunnel through the real binaries: with `--p2p-tls-cert` the router
//! announces a `/tls` tunnel address, an agent that trusts its CA carries chat and streams inside
//! TLS, an agent that trusts another CA never gets a tunnel, a plaintext preamble is refused with
//! its own status, and start-up refuses a certificate without its key.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{Options, Site, chat, sse_events};

fn fixture(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
        .display()
        .to_string()
}

fn tls_router_args() -> Vec<String> {
    vec![
        "--p2p-tls-cert".into(),
        fixture("router.pem"),
        "--p2p-tls-key".into(),
        fixture("router.key"),
    ]
}

#[test]
fn an_agent_that_trusts_the_router_carries_traffic_inside_tls() {
    let args = tls_router_args();
    let ca = fixture("ca.pem");
    let site = Site::start(
        "tunnel_tls",
        Options::new()
            .sim(&["--models", "sim-model"])
            .router_args(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .agent(0, &["--p2p-tls-ca", &ca]),
    );
    site.assert_chat_ok("sim-model");
    let mut stream = site.send_chat_stream("sim-model");
    let response = stream.read_response().unwrap();
    assert_eq!(response.status, 200);
    let events = sse_events(&response.body);
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    assert!(
        site.logs().contains("tunnel up (TLS)"),
        "the agent dialed TLS\n{}",
        site.logs()
    );
}

#[test]
fn an_agent_that_trusts_another_ca_gets_no_tunnel_and_plaintext_is_refused() {
    let args = tls_router_args();
    let mut site = Site::start(
        "tunnel_tls_refused",
        Options::new()
            .sim(&["--models", "sim-model"])
            .router_args(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .skip_model_wait(),
    );
    let other = fixture("other-ca.pem");
    let agent = site.spawn_agent(0, &["--p2p-tls-ca", &other]);
    site.wait_for("the agent's failed TLS handshake", || {
        site.agents[agent]
            .log_text()
            .contains("TLS handshake with the router failed")
            .then_some(())
    });
    assert_eq!(site.router_metric("hivenet_shard_tunnels_open"), 0.0);
    assert!(!site.model_ids().contains(&"sim-model".to_string()));
    // A plaintext preamble on the TLS port: status 4, "TLS required".
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", site.p2p)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket
        .write_all(&hivenet_router::net::tunnel::preamble::encode(
            hivenet_router::net::tunnel::preamble::Codec::Lean,
            0,
            "not.a.token",
        ))
        .unwrap();
    let mut status = [0u8; 1];
    socket.read_exact(&mut status).unwrap();
    assert_eq!(status[0], 4);
    // The router keeps serving.
    site.wait_health();
    let (status, _, _) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert_eq!(status, 404);
}

#[test]
fn start_up_refuses_a_certificate_without_its_key() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tunnel-tls-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| common::refused_start(&dir, args, &[]);
    let cert = fixture("router.pem");
    let error = run(&["--p2p-tls-cert", &cert]);
    assert!(error.contains("--p2p-tls-key"), "{error}");
    let other = fixture("other.key");
    let error = run(&["--p2p-tls-cert", &cert, "--p2p-tls-key", &other]);
    assert!(error.contains("--p2p-tls-cert"), "{error}");
}

/// Opens a TLS tunnel to shard 0 by hand and presents `token`; returns the status byte inside
/// TLS and the TLS stream.
async fn open_by_hand(
    p2p: u16,
    token: &str,
) -> (u8, tokio_rustls::client::TlsStream<tokio::net::TcpStream>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", p2p))
        .await
        .unwrap();
    socket
        .write_all(&hivenet_router::net::tunnel::tls::encode_hint(0))
        .await
        .unwrap();
    let mut status = [0u8; 1];
    socket.read_exact(&mut status).await.unwrap();
    assert_eq!(status[0], 0, "the hint is accepted");
    let config = hivenet_router::net::tunnel::tls::client_config(Some(std::path::Path::new(
        &fixture("ca.pem"),
    )))
    .unwrap();
    let name = hivenet_router::net::tunnel::tls::server_name("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, socket)
        .await
        .unwrap();
    tls.write_all(&hivenet_router::net::tunnel::preamble::encode(
        hivenet_router::net::tunnel::preamble::Codec::Lean,
        0,
        token,
    ))
    .await
    .unwrap();
    tls.flush().await.unwrap();
    tls.read_exact(&mut status).await.unwrap();
    (status[0], tls)
}

#[test]
fn inside_tls_the_shard_refuses_a_bad_token_and_drops_a_session_that_is_not_live() {
    let args = tls_router_args();
    let site = Site::start(
        "tunnel_tls_sessions",
        Options::new()
            .router_args(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .skip_model_wait(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (status, _) = open_by_hand(site.p2p, "not.a.token").await;
        assert_eq!(status, 1, "bad token");
        // A genuine session token names this run of the router as its issuer.
        let secret = common::agent_auth::site_secret();
        let agent = common::agent_auth::AgentKey::generate();
        let (_, answer) = common::agent_auth::authenticate(site.grpc, &agent).await;
        let genuine = secret
            .verify(
                &answer.expect("authenticated").session_token,
                hivenet_router::base::credentials::SESSION_AUDIENCE,
            )
            .unwrap();
        // Signed with the site secret, but issued by another router: refused at the preamble.
        let elsewhere = secret.sign(&hivenet_router::base::credentials::Claims {
            rtr: Some("12D3KooWother/0123456789abcdef".into()),
            ..genuine.clone()
        });
        let (status, _) = open_by_hand(site.p2p, &elsewhere).await;
        assert_eq!(status, 1, "a session token of another router");
        // This router's, for a session it never opened.
        let token = secret.sign(&hivenet_router::base::credentials::Claims {
            sid: 987_654,
            ..genuine
        });
        let (status, tls) = open_by_hand(site.p2p, &token).await;
        assert_eq!(status, 0, "the shard accepts a well-signed token");
        // The router speaks the lean tunnel as the client; the control core then finds the
        // session is not live and the shard drops the tunnel, which ends the connection.
        let (_acceptor, connection) = hivenet_router::net::tunnel::link::server(tls);
        let ended = tokio::time::timeout(Duration::from_secs(10), connection).await;
        assert!(ended.is_ok(), "the tunnel of a dead session is closed");
    });
    assert!(site.logs().contains("session not live"), "{}", site.logs());
    assert_eq!(site.router_metric("hivenet_shard_tunnels_open"), 0.0);
}

//! Proves through the real router that agent authentication JWTs have a maximum lifetime
//! (`--agent-token-max-lifetime`, default 1h): a correctly signed token valid for 30 days, or one
//! without `iat` expiring in two hours, is refused with the reason, while `hivenet-agent`'s own
//! five-minute tokens (the agent joins) and a short token without `iat` are accepted; a maximum
//! below the agent's five minutes stops start-up.

mod common;

use std::path::PathBuf;
use std::time::SystemTime;

use common::{Options, SECRET, Site, refused_start};
use hivenet_router::base::credentials::{AUTH_AUDIENCE, Claims, Secret, unix_seconds};
use hivenet_router::wire::proto::AuthRequest;
use hivenet_router::wire::proto::agent_control_client::AgentControlClient;

/// Authenticates with a token of the given `iat`/`exp`; `Ok` or the refusal's message.
fn authenticate(site: &Site, iat: Option<u64>, exp: u64) -> Result<(), String> {
    let secret = Secret::new(SECRET.as_bytes()).unwrap();
    let peer_id = "12D3KooWlifetimetest".to_owned();
    let token = secret.sign(&Claims {
        sub: peer_id.clone(),
        aud: AUTH_AUDIENCE.to_owned(),
        iat,
        exp,
        sid: 0,
    });
    let grpc = site.grpc;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let mut client = AgentControlClient::connect(format!("http://{grpc}"))
                .await
                .expect("connect to the router's gRPC port");
            client
                .authenticate(AuthRequest {
                    token,
                    peer_id,
                    capacity: 1,
                })
                .await
                .map(|_| ())
                .map_err(|status| {
                    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
                    status.message().to_owned()
                })
        })
}

#[test]
fn long_lived_agent_tokens_are_refused() {
    // The real agent authenticates with its five-minute tokens and joins.
    let site = Site::start(
        "agent-token-lifetime",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "2"]),
    );
    site.assert_chat_ok("sim-model");

    let now = unix_seconds(SystemTime::now());
    assert_eq!(authenticate(&site, Some(now), now + 300), Ok(()));
    assert_eq!(authenticate(&site, None, now + 600), Ok(()));

    let refused = authenticate(&site, Some(now), now + 30 * 86_400).unwrap_err();
    assert!(
        refused.contains("longer than the 3600 s maximum"),
        "{refused}"
    );
    let refused = authenticate(&site, None, now + 7200).unwrap_err();
    // The router reads its clock after this test did: a second may have passed in between.
    assert!(
        refused.contains("valid for 7200 s") || refused.contains("valid for 7199 s"),
        "{refused}"
    );
    // A future iat cannot stretch a token: what counts is how long it stays valid from now.
    let refused = authenticate(&site, Some(now + 86_400), now + 86_400 + 300).unwrap_err();
    assert!(refused.contains("longer than"), "{refused}");
    let log = site.router.log_text();
    assert!(
        log.contains("agent authentication refused") && log.contains("--agent-token-max-lifetime"),
        "{log}"
    );
    // The agent already in the pool is unaffected.
    site.assert_chat_ok("sim-model");
}

#[test]
fn a_maximum_below_the_agents_token_lifetime_stops_start_up() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-token-lifetime")
        .join(format!("start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stderr = refused_start(
        &dir,
        &["--agent-token-max-lifetime", "1m"],
        &[("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true")],
    );
    assert!(
        stderr.contains("--agent-token-max-lifetime must be at least 5m"),
        "{stderr}"
    );
}

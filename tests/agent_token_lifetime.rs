//! Proves through the real router that agent authentication JWTs have a maximum lifetime
//! (`--agent-token-max-lifetime`, default 1h): a correctly signed token valid for 30 days, or one
//! without `iat` expiring in two hours, is refused with the reason, while `hivenet-agent`'s own
//! 30-second tokens (the agent joins), a five-minute one and a short token without `iat` are
//! accepted; a maximum below the agent's 30 seconds stops start-up.

mod common;

use std::path::PathBuf;
use std::time::SystemTime;

use common::agent_auth::{self, AgentKey, site_secret};
use common::{Options, Site, refused_start};
use hivenet_router::base::credentials::{Claims, unix_seconds};

/// Authenticates with a token of the given `iat`/`exp`, otherwise as `hivenet-agent` does
/// (answering a challenge, signed by its key); `Ok` or the refusal's message.
fn authenticate(site: &Site, iat: Option<u64>, exp: u64) -> Result<(), String> {
    let grpc = site.grpc;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let agent = AgentKey::generate();
            let mut client = agent_auth::client(grpc).await;
            let challenge = agent_auth::challenge(&mut client).await;
            let mut request = agent_auth::auth_request(&site_secret(), &agent, &challenge);
            request.token = site_secret().sign(&Claims {
                sub: agent.peer_id.clone(),
                aud: challenge.router_peer_id.clone(),
                iat,
                exp,
                sid: 0,
                nonce: Some(hex::encode(&challenge.router_nonce)),
                rtr: None,
            });
            client
                .authenticate(request)
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
    // The real agent authenticates with its 30-second tokens and joins.
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
        &["--agent-token-max-lifetime", "20s"],
        &[("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true")],
    );
    assert!(
        stderr.contains("--agent-token-max-lifetime must be at least 30s"),
        "{stderr}"
    );
}

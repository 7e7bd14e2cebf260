//! Proves, through real routers and a real agent, that agents and routers prove themselves to
//! each other before any credential travels (`base::challenge`, issue 37 finding 2):
//!
//! - an address in an agent's list that does not hold the site secret (an impostor a store writer
//!   listed, a mistyped DNS name) is challenged, fails, and receives no token and no
//!   registration; the agent logs it, counts it, and serves through the real router, whose
//!   `/metrics` shows the count;
//! - an authentication seen by someone else is good once, at the router it was made for: replayed
//!   at that router it is refused as a spent nonce, at another router as another router's;
//! - a site member who holds the secret cannot authenticate under another agent's peer ID without
//!   that agent's key, so cannot register models under it;
//! - a session token opens a session only at the router run that issued it;
//! - a session renewed before its token expires keeps its session and tunnels.

mod common;

use common::runtime;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::agent_auth::{self, AgentKey, site_secret};
use common::{Options, Site, metric_sum};
use futures_util::Stream;
use hivenet_router::base::credentials::Secret;
use hivenet_router::wire::proto::agent_control_server::AgentControl;
use hivenet_router::wire::proto::{
    AgentMessage, AuthRequest, AuthResponse, ChallengeRequest, ChallengeResponse, RouterMessage,
};

fn sim_site(name: &str, router_args: &[&str]) -> Site {
    Site::start(
        name,
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .router_args(router_args)
            .skip_model_wait(),
    )
}

// ---------------------------------------------------------------------------------------------
// An impostor: answers on the control port as a router would, without the site secret.

const IMPOSTOR_PEER_ID: &str = "12D3KooWimpostor";

#[derive(Default)]
struct Calls {
    challenges: AtomicU32,
    authentications: AtomicU32,
    sessions: AtomicU32,
}

struct Impostor {
    /// Not the site's: what an impostor can best do is guess.
    guessed: Secret,
    calls: Arc<Calls>,
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<RouterMessage, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AgentControl for Impostor {
    async fn challenge(
        &self,
        request: tonic::Request<ChallengeRequest>,
    ) -> Result<tonic::Response<ChallengeResponse>, tonic::Status> {
        self.calls.challenges.fetch_add(1, Ordering::SeqCst);
        let (router_nonce, proof) =
            self.guessed
                .proof_key()
                .answer(IMPOSTOR_PEER_ID, &request.get_ref().agent_nonce, 0);
        Ok(tonic::Response::new(ChallengeResponse {
            router_peer_id: IMPOSTOR_PEER_ID.to_owned(),
            router_nonce: router_nonce.to_vec(),
            proof: proof.to_vec(),
        }))
    }

    async fn authenticate(
        &self,
        _request: tonic::Request<AuthRequest>,
    ) -> Result<tonic::Response<AuthResponse>, tonic::Status> {
        self.calls.authentications.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::unavailable(
            "an impostor keeps what it was sent",
        ))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        _request: tonic::Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<SessionStream>, tonic::Status> {
        self.calls.sessions.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::unavailable("impostor"))
    }
}

#[test]
fn an_agent_sends_no_credential_to_a_router_that_cannot_prove_itself() {
    let mut site = sim_site("proof_impostor", &[]);
    let calls = Arc::new(Calls::default());
    let (impostor, _runtime) = common::agent_auth::serve_agent_control(Impostor {
        guessed: Secret::new(b"a guess at the site secret").unwrap(),
        calls: calls.clone(),
    });
    let routers = format!("{impostor},{}", site.grpc);
    site.spawn_agent(0, &["--capacity", "4", "--routers", &routers]);
    site.wait_models(&["sim-model"]);
    site.assert_chat_ok("sim-model");
    // The agent keeps trying the impostor (with backoff), and each time stops at its proof.
    site.wait_for("the impostor to be challenged twice", || {
        (calls.challenges.load(Ordering::SeqCst) >= 2).then_some(())
    });
    assert_eq!(calls.authentications.load(Ordering::SeqCst), 0);
    assert_eq!(calls.sessions.load(Ordering::SeqCst), 0);
    let log = site.agents[0].log_text();
    assert!(
        log.contains("did not prove it belongs to the site, and was sent no credential"),
        "{log}"
    );
    // The agent's heartbeats carry the count to the real router's `/metrics`.
    let counted = site.wait_metric("hivenet_agent_unproven_routers_total", |count| count >= 1.0);
    assert!(counted >= 1.0);
    assert_eq!(calls.authentications.load(Ordering::SeqCst), 0);
}

#[test]
fn an_authentication_seen_by_another_is_good_once_at_one_router() {
    let first = sim_site("proof_replay_first", &[]);
    let second = sim_site("proof_replay_second", &[]);
    let agent = AgentKey::generate();
    runtime().block_on(async {
        let (captured, answer) = agent_auth::authenticate(first.grpc, &agent).await;
        answer.expect("the agent's own authentication is accepted");
        // Replayed where it was made: the router nonce is spent.
        let mut client = agent_auth::client(first.grpc).await;
        let replayed = client.authenticate(captured.clone()).await.unwrap_err();
        assert_eq!(replayed.code(), tonic::Code::Unauthenticated);
        assert!(
            replayed.message().contains("already spent"),
            "{}",
            replayed.message()
        );
        // Replayed at another router of the site: made for another router.
        let mut client = agent_auth::client(second.grpc).await;
        let elsewhere = client.authenticate(captured).await.unwrap_err();
        assert_eq!(elsewhere.code(), tonic::Code::Unauthenticated);
        assert!(
            elsewhere.message().contains("another router"),
            "{}",
            elsewhere.message()
        );
    });
    let refused = |site: &Site, reason: &str| {
        metric_sum(
            &site.router_metrics(),
            "hivenet_agent_auth_refused_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(refused(&first, "nonce"), 1.0);
    assert_eq!(refused(&second, "token"), 1.0);
    assert!(
        first
            .router
            .log_text()
            .contains("agent authentication refused")
    );
}

#[test]
fn a_site_member_cannot_authenticate_under_another_agents_peer_id() {
    let mut site = sim_site("proof_identity", &[]);
    site.spawn_agent(0, &["--capacity", "4"]);
    site.wait_models(&["sim-model"]);
    let victim = site.wait_for("the agent's peer ID in its log", || {
        let log = site.agents[0].log_text();
        let at = log.find("peer_id=")? + "peer_id=".len();
        let id: String = log[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        (!id.is_empty()).then_some(id)
    });
    // The attacker holds the site secret (a token for any peer ID), not the victim's key.
    let attacker = AgentKey::generate();
    runtime().block_on(async {
        let mut client = agent_auth::client(site.grpc).await;
        let challenge = agent_auth::challenge(&mut client).await;
        let mut request = agent_auth::auth_request(&site_secret(), &attacker, &challenge);
        request.peer_id = victim.clone();
        request.token = site_secret().auth_token(
            &victim,
            &challenge.router_peer_id,
            &challenge.router_nonce,
            std::time::SystemTime::now(),
        );
        let refused = client.authenticate(request).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(
            refused.message().contains("does not belong to its peer ID"),
            "{}",
            refused.message()
        );
    });
    assert_eq!(
        metric_sum(
            &site.router_metrics(),
            "hivenet_agent_auth_refused_total",
            &[("reason", "identity")]
        ),
        1.0
    );
    // Still one agent, the victim, serving.
    site.assert_chat_ok("sim-model");
    assert_eq!(site.router_metric("hivenet_routing_agents_routable"), 1.0);
}

#[test]
fn a_session_token_opens_a_session_only_where_it_was_issued() {
    let first = sim_site("proof_session_first", &[]);
    let second = sim_site("proof_session_second", &[]);
    let agent = AgentKey::generate();
    runtime().block_on(async {
        let (_, answer) = agent_auth::authenticate(first.grpc, &agent).await;
        let token = answer.expect("authenticated").session_token;
        let mut client = agent_auth::client(second.grpc).await;
        let mut request = tonic::Request::new(futures_util::stream::pending::<AgentMessage>());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let refused = client.session(request).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(
            refused.message().contains("another router"),
            "{}",
            refused.message()
        );
    });
}

#[test]
fn a_renewed_session_keeps_its_tunnels() {
    // Renewal at 80 % of a 3 s session: every 2.4 s.
    let mut site = sim_site("proof_renewal", &["--session-ttl", "3s"]);
    site.spawn_agent(0, &["--capacity", "4"]);
    site.wait_models(&["sim-model"]);
    site.wait_for("two renewals", || {
        (site
            .router
            .log_text()
            .matches("agent session renewed")
            .count()
            >= 2)
            .then_some(())
    });
    // The session outlived its first token twice over: one session, its tunnels still open.
    let log = site.router.log_text();
    assert_eq!(log.matches("agent authenticated").count(), 1, "{log}");
    assert!(!log.contains("agent session ended"), "{log}");
    site.assert_chat_ok("sim-model");
    let agent_log = site.agents[0].log_text();
    assert_eq!(
        agent_log.matches("session open, registered").count(),
        1,
        "{agent_log}"
    );
}

/// The attack as it was run: whoever can write the store's router records lists an
/// impostor there. The real router hands the listing to its agents (discovery), the agent dials
/// the impostor, challenges it, and sends it nothing more: before the proof, it sent its JWT and
/// registered its models within 1.4 s.
#[test]
fn an_impostor_listed_in_the_store_is_dialled_and_sent_nothing() {
    let store = common::valkey::Valkey::primary();
    let calls = Arc::new(Calls::default());
    let (impostor, _runtime) = common::agent_auth::serve_agent_control(Impostor {
        guessed: Secret::new(b"the store's password is not the site secret").unwrap(),
        calls: calls.clone(),
    });
    let addrs = store.addr();
    let mut site = Site::start(
        "proof_store_impostor",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .skip_model_wait()
            .router_args(&[
                // The harness puts this router's gRPC address in place of `{grpc}`.
                "--advertise-grpc-addr",
                "{grpc}",
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                &addrs,
                "--router-id",
                "real",
                "--sync-interval",
                "200ms",
            ]),
    );
    site.spawn_agent(0, &["--capacity", "4", "--heartbeat-interval", "500ms"]);
    site.wait_models(&["sim-model"]);
    // The forged record is rewritten like a live router's, so the real router lists it.
    let forging = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let forger = {
        let (forging, addrs) = (forging.clone(), store.addr());
        std::thread::spawn(move || {
            while forging.load(Ordering::SeqCst) {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64;
                let record = serde_json::json!({
                    "run": 1,
                    "at_unix_ms": now,
                    "interval_ms": 200,
                    "peer_id": IMPOSTOR_PEER_ID,
                    "grpc_addr": impostor.to_string(),
                    "agents": [],
                });
                let _ = common::valkey::call(
                    &addrs,
                    None,
                    &[
                        "HSET",
                        "hivenet:{default}:routers",
                        "impostor",
                        &record.to_string(),
                    ],
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        })
    };
    site.wait_for("the agent to dial the listed impostor", || {
        (calls.challenges.load(Ordering::SeqCst) >= 1).then_some(())
    });
    site.wait_metric("hivenet_agent_unproven_routers_total", |count| count >= 1.0);
    forging.store(false, Ordering::SeqCst);
    forger.join().unwrap();
    assert_eq!(calls.authentications.load(Ordering::SeqCst), 0);
    assert_eq!(calls.sessions.load(Ordering::SeqCst), 0);
    // The agent still serves through the real router.
    site.assert_chat_ok("sim-model");
}

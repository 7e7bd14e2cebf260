//! Proves, with real routers (no sync store) and a real agent, what agent discovery does before a
//! store lists the site's routers: an agent given two routers with `--routers` (or
//! `HIVENET_AGENT_ROUTERS`) keeps a session with each and is served through both; a router
//! reached under two addresses gets one session and one registration (recognized by its peer
//! ID), and so does a router that lists itself under its advertised address; and a router refuses
//! to start with a listen address as `--advertise-grpc-addr`. With a stand-in router that lists
//! a real one (as routers will once the sync store lists the site), an agent given only the
//! stand-in opens a session with the listed router and reports both in its heartbeats.

mod common;

use std::pin::Pin;
use std::time::Duration;

use common::{Options, Site, metric_sum, refused_start};
use futures_util::Stream;
use hivenet_router::wire::proto::agent_control_server::AgentControl;
use hivenet_router::wire::proto::agent_message::Kind as AgentKind;
use hivenet_router::wire::proto::router_message::Kind as RouterKind;
use hivenet_router::wire::proto::{
    AgentMessage, AuthRequest, AuthResponse, ChallengeRequest, ChallengeResponse, HeartbeatAck,
    RouterMessage, SiteRouter,
};

/// Tunnels per agent session: the harness starts routers with `--shards 2`.
const SHARDS: f64 = 2.0;

fn sim_site(name: &str) -> Site {
    // The advertised address is not this router's gRPC port (the harness picks that port at
    // start): without a store a router lists only itself, so the agent, which already reaches
    // it, must never dial the address. Nothing listens there; a dial would show in its log.
    Site::start(
        name,
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .router_args(&["--advertise-grpc-addr", "127.0.0.1:1"])
            .skip_model_wait(),
    )
}

/// Sessions an agent opened, from its log.
fn connects(site: &Site, agent: usize) -> usize {
    site.agents[agent]
        .log_text()
        .matches("connecting to router")
        .count()
}

#[test]
fn an_agent_keeps_a_session_with_each_listed_router() {
    let mut site_a = sim_site("discovery_two_routers_a");
    let site_b = Site::start(
        "discovery_two_routers_b",
        Options::new()
            .router_args(&["--advertise-grpc-addr", "127.0.0.1:2"])
            .skip_model_wait(),
    );
    let routers = format!("{},{}", site_a.grpc, site_b.grpc);
    // `--router-grpc` (the harness's, naming router A) is ignored when the list is given.
    site_a.spawn_agent_with_env(
        0,
        &["--capacity", "4"],
        &[("HIVENET_AGENT_ROUTERS", &routers)],
    );
    for site in [&site_a, &site_b] {
        site.wait_metric("hivenet_shard_tunnels_open", |open| open == SHARDS);
        site.wait_metric("hivenet_routing_agents_routable", |routable| {
            routable == 1.0
        });
        site.wait_models(&["sim-model"]);
    }
    site_a.assert_chat_ok("sim-model");
    site_b.assert_chat_ok("sim-model");
    // Heartbeats (every 5 s) carried each router's list of itself: still two sessions.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(connects(&site_a, 0), 2, "{}", site_a.agents[0].log_tail());
    for site in [&site_a, &site_b] {
        let metrics = site.router_metrics();
        assert_eq!(
            metric_sum(&metrics, "hivenet_shard_tunnels_open", &[]),
            SHARDS
        );
        assert_eq!(
            metric_sum(&metrics, "hivenet_routing_agents_routable", &[]),
            1.0
        );
    }
}

#[test]
fn a_router_reached_under_two_addresses_gets_one_session() {
    let mut site = sim_site("discovery_dedupe");
    let port = site.grpc.port();
    let routers = format!("127.0.0.1:{port},localhost:{port}");
    site.spawn_agent(0, &["--capacity", "4", "--routers", &routers]);
    site.wait_metric("hivenet_routing_agents_routable", |routable| {
        routable == 1.0
    });
    site.wait_for("the agent to see the router twice", || {
        site.agents[0]
            .log_text()
            .contains("is already reached by another session")
            .then_some(())
    });
    site.assert_chat_ok("sim-model");
    // One registration and one session's tunnels, also after heartbeats carry the router's
    // list of itself.
    std::thread::sleep(Duration::from_secs(6));
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(&metrics, "hivenet_shard_tunnels_open", &[]),
        SHARDS,
        "{}",
        site.logs()
    );
    assert_eq!(
        metric_sum(&metrics, "hivenet_routing_agents_routable", &[]),
        1.0
    );
    let registered = site.router.log_text().matches("agent registered").count();
    assert_eq!(registered, 1, "{}", site.router.log_tail());
    assert_eq!(connects(&site, 0), 2, "the two --routers entries only");
}

#[test]
fn a_listen_address_is_refused_as_the_advertised_address() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("agent-discovery-refusals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for bad in [":50051", "0.0.0.0:50051", "[::]:50051"] {
        let stderr = refused_start(&dir, &["--advertise-grpc-addr", bad], &[]);
        assert!(
            stderr.contains("--advertise-grpc-addr") && stderr.contains("listen address"),
            "{bad}: {stderr}"
        );
    }
    let stderr = refused_start(
        &dir,
        &[],
        &[("HIVENET_ROUTER_ADVERTISE_GRPC_ADDR", "router-0:grpc")],
    );
    assert!(
        stderr.contains("--advertise-grpc-addr") && stderr.contains("numeric port"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// A stand-in router that lists another router, as a router with a sync store lists its site.

const LISTER_PEER_ID: &str = "12D3KooWlisterstandin";

struct Lister {
    /// What every authentication response and heartbeat ack lists.
    routers: Vec<SiteRouter>,
    /// Each heartbeat's `connected_router_peer_ids`, to the test.
    heartbeats: std::sync::mpsc::Sender<Vec<String>>,
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<RouterMessage, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AgentControl for Lister {
    /// Answers as a router of the site: it holds the site secret.
    async fn challenge(
        &self,
        request: tonic::Request<ChallengeRequest>,
    ) -> Result<tonic::Response<ChallengeResponse>, tonic::Status> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let (router_nonce, proof) = common::agent_auth::site_secret().proof_key().answer(
            LISTER_PEER_ID,
            &request.get_ref().agent_nonce,
            now_ms,
        );
        Ok(tonic::Response::new(ChallengeResponse {
            router_peer_id: LISTER_PEER_ID.to_owned(),
            router_nonce: router_nonce.to_vec(),
            proof: proof.to_vec(),
        }))
    }

    async fn authenticate(
        &self,
        _request: tonic::Request<AuthRequest>,
    ) -> Result<tonic::Response<AuthResponse>, tonic::Status> {
        Ok(tonic::Response::new(AuthResponse {
            session_token: "stand-in-session".to_owned(),
            session_ttl_ms: 3_600_000,
            router_peer_id: LISTER_PEER_ID.to_owned(),
            // Nothing listens there: the stand-in serves no requests, its tunnel just retries.
            tunnel_addrs: vec!["/ip4/127.0.0.1/tcp/1".to_owned()],
            shard_count: 1,
            heartbeat_interval_ms: 300,
            routing_signal_interval_ms: 0,
            routers: self.routers.clone(),
            routers_known: true,
        }))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: tonic::Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<SessionStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (to_agent, outbound) = tokio::sync::mpsc::channel(16);
        let (routers, heartbeats) = (self.routers.clone(), self.heartbeats.clone());
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                if let Some(AgentKind::Heartbeat(heartbeat)) = message.kind {
                    let _ = heartbeats.send(heartbeat.connected_router_peer_ids);
                    let ack = RouterMessage {
                        kind: Some(RouterKind::HeartbeatAck(HeartbeatAck {
                            sent_at_unix_ms: heartbeat.sent_at_unix_ms,
                            routers: routers.clone(),
                            routers_known: true,
                        })),
                    };
                    if to_agent.send(Ok(ack)).await.is_err() {
                        break;
                    }
                }
            }
        });
        let outbound = futures_util::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|message| (message, outbound))
        });
        Ok(tonic::Response::new(Box::pin(outbound)))
    }
}

#[test]
fn an_agent_opens_a_session_with_a_listed_router_and_reports_both() {
    let mut site = sim_site("discovery_listed");
    let (heartbeats, from_lister) = std::sync::mpsc::channel();
    let (lister, _runtime) = common::agent_auth::serve_agent_control(Lister {
        routers: vec![
            SiteRouter {
                peer_id: LISTER_PEER_ID.to_owned(),
                grpc_addr: "127.0.0.1:1".to_owned(),
            },
            SiteRouter {
                peer_id: "12D3KooWlistedrouter".to_owned(),
                grpc_addr: site.grpc.to_string(),
            },
        ],
        heartbeats,
    });
    site.spawn_agent(0, &["--capacity", "4", "--routers", &lister.to_string()]);
    // The real router, known to the agent only from the stand-in's list, gets its session.
    site.wait_metric("hivenet_shard_tunnels_open", |open| open == SHARDS);
    site.wait_metric("hivenet_routing_agents_routable", |routable| {
        routable == 1.0
    });
    site.wait_models(&["sim-model"]);
    site.assert_chat_ok("sim-model");
    // Heartbeats report both routers once both sessions are up: the stand-in, and the real
    // router under its own peer ID (not the one the list gave it).
    let reported = common::poll(common::WAIT, || {
        let connected = from_lister.recv_timeout(Duration::from_secs(1)).ok()?;
        (connected.len() == 2).then_some(connected)
    })
    .unwrap_or_else(|| panic!("no heartbeat reported both routers\n{}", site.logs()));
    assert!(
        reported.iter().any(|peer| peer == LISTER_PEER_ID),
        "{reported:?}"
    );
    assert!(
        reported.iter().all(|peer| peer != "12D3KooWlistedrouter"),
        "{reported:?}"
    );
    // The stand-in's own entry (its peer ID, already reached) was never dialed: two sessions.
    assert_eq!(connects(&site, 0), 2, "{}", site.agents[0].log_tail());
}

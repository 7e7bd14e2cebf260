//! An agent's authentication done by hand, step by step as `hivenet-agent` does it
//! (`hivenet_router::base::challenge`), so tests can replay, misdirect and tamper with its parts.

use std::net::SocketAddr;
use std::time::SystemTime;

use hivenet_router::base::challenge;
use hivenet_router::base::credentials::Secret;
use hivenet_router::wire::proto::agent_control_client::AgentControlClient;
use hivenet_router::wire::proto::{AuthRequest, AuthResponse, ChallengeRequest, ChallengeResponse};
use libp2p_identity::Keypair;

/// An agent identity: its key and the peer ID that key makes.
pub struct AgentKey {
    pub keypair: Keypair,
    pub peer_id: String,
}

impl AgentKey {
    pub fn generate() -> AgentKey {
        let keypair = Keypair::generate_ed25519();
        let peer_id = keypair.public().to_peer_id().to_string();
        AgentKey { keypair, peer_id }
    }
}

pub fn site_secret() -> Secret {
    Secret::new(super::SECRET.as_bytes()).expect("a non-empty secret")
}

pub async fn client(grpc: SocketAddr) -> AgentControlClient<tonic::transport::Channel> {
    AgentControlClient::connect(format!("http://{grpc}"))
        .await
        .expect("the router's gRPC port answers")
}

/// Asks the router at `grpc` for a challenge and checks its proof with the site secret.
pub async fn challenge(
    client: &mut AgentControlClient<tonic::transport::Channel>,
) -> ChallengeResponse {
    let agent_nonce = challenge::random_bytes::<{ challenge::AGENT_NONCE_LEN }>();
    let answer = client
        .challenge(ChallengeRequest {
            agent_nonce: agent_nonce.to_vec(),
        })
        .await
        .expect("the router answers a challenge")
        .into_inner();
    assert!(
        site_secret().proof_key().router_proof_holds(
            &agent_nonce,
            &answer.router_nonce,
            &answer.router_peer_id,
            &answer.proof
        ),
        "the router proves it holds the site secret"
    );
    answer
}

/// The `Authenticate` request `agent` makes in answer to `challenge`, signed as `token_secret`.
pub fn auth_request(
    token_secret: &Secret,
    agent: &AgentKey,
    challenge: &ChallengeResponse,
) -> AuthRequest {
    let proof = challenge::agent_proof(
        &agent.keypair,
        &challenge.router_nonce,
        &challenge.router_peer_id,
    );
    AuthRequest {
        token: token_secret.auth_token(
            &agent.peer_id,
            &challenge.router_peer_id,
            &challenge.router_nonce,
            SystemTime::now(),
        ),
        peer_id: agent.peer_id.clone(),
        capacity: 4,
        router_nonce: challenge.router_nonce.clone(),
        public_key: proof.public_key,
        signature: proof.signature,
        session_token: String::new(),
    }
}

/// Challenge and authenticate as `agent`; the request is returned to be replayed.
pub async fn authenticate(
    grpc: SocketAddr,
    agent: &AgentKey,
) -> (AuthRequest, Result<AuthResponse, tonic::Status>) {
    let mut client = client(grpc).await;
    let challenge = challenge(&mut client).await;
    let request = auth_request(&site_secret(), agent, &challenge);
    let answer = client
        .authenticate(request.clone())
        .await
        .map(tonic::Response::into_inner);
    (request, answer)
}

/// Serves a stand-in `AgentControl` (a fake or impostor router) on a loopback port from its own
/// runtime, so the test's blocking waits do not stall it. Keep the runtime: dropping it stops the
/// service.
pub fn serve_agent_control<S>(service: S) -> (SocketAddr, tokio::runtime::Runtime)
where
    S: hivenet_router::wire::proto::agent_control_server::AgentControl,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move {
        let incoming = futures_util::stream::unfold(listener, |listener| async move {
            Some((listener.accept().await.map(|(socket, _)| socket), listener))
        });
        tonic::transport::Server::builder()
            .add_service(
                hivenet_router::wire::proto::agent_control_server::AgentControlServer::new(service),
            )
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (addr, runtime)
}

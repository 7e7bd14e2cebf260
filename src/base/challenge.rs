//! The handshake in which an agent and a router prove themselves to each other before any
//! credential travels.
//!
//! ```text
//! agent -> router  Challenge    { agent_nonce }                       32 random bytes
//! router -> agent               { router_peer_id, router_nonce, proof }
//!                  proof = HMAC-SHA256(site secret, "hivenet router proof v1"
//!                                      | agent_nonce | router_nonce | router_peer_id)
//! agent            checks the proof. A router that cannot make it does not hold the site's
//!                  secret: the agent sends it nothing more, logs it and counts it.
//! agent -> router  Authenticate { token, peer_id, router_nonce, public_key, signature }
//!                  token: the site-signed JWT, audience = router_peer_id, nonce = router_nonce
//!                  signature: the agent's identity key over
//!                             "hivenet agent proof v1" | router_nonce | router_peer_id
//! router           checks that router_nonce is one it issued (its tag), at most NONCE_TTL old and
//!                  never spent (it spends it now), that the token names this router and this
//!                  nonce, and that public_key hashes to peer_id and made the signature.
//! ```
//!
//! What this stops: an address a store writer or a wrong DNS name puts in an agent's list
//! receives an agent nonce and nothing else; a token seen on the wire is good for one
//! `Authenticate` at one router within [`NONCE_TTL`] and is spent by then; a site member who
//! knows the secret cannot register under another agent's peer ID without that agent's key. What
//! it does not stop: a relay between an agent and a real router on a plaintext network can read
//! what passes. TLS on the tunnel (`--p2p-tls-cert`) closes that for the data.
//!
//! Router nonces are stateless until spent: the tag proves a nonce came from this router with
//! this secret, so a flood of `Challenge` calls costs the router no memory. Only a nonce an
//! agent spends with a valid token enters the [`NonceLedger`], so only site members can fill it.

use std::collections::HashMap;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use libp2p_identity::{Keypair, PeerId, PublicKey};
use sha2::Sha256;

/// How long a router nonce may be spent after it was issued. An agent spends it right after the
/// challenge; the rest is room for a loaded router and clock steps within one process.
pub const NONCE_TTL: Duration = Duration::from_secs(30);
/// Bytes of the agent's nonce.
pub const AGENT_NONCE_LEN: usize = 32;
/// Bytes of a router nonce: issued-at (8), random (16), tag (16).
pub const ROUTER_NONCE_LEN: usize = 40;
/// Spent nonces remembered at once. Only valid authentications add to it, and each entry leaves
/// [`NONCE_TTL`] after it was issued: 100,000 would be 3,300 agent authentications a second.
pub const LEDGER_CAPACITY: usize = 100_000;

const ROUTER_PROOF_CONTEXT: &[u8] = b"hivenet router proof v1";
const ROUTER_NONCE_CONTEXT: &[u8] = b"hivenet router nonce v1";
const AGENT_PROOF_CONTEXT: &[u8] = b"hivenet agent proof v1";
const TAG_LEN: usize = 16;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChallengeError {
    #[error("the router nonce was not issued by this router")]
    ForeignNonce,
    #[error("the router nonce has expired")]
    ExpiredNonce,
    #[error("the router nonce was already spent")]
    SpentNonce,
    #[error("too many authentications in flight; try again")]
    LedgerFull,
    #[error("the agent's public key is malformed")]
    BadPublicKey,
    #[error("the agent's public key does not belong to its peer ID")]
    KeyNotPeer,
    #[error("the agent's signature does not verify")]
    BadSignature,
}

/// Fresh random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    bytes
}

/// The site secret's HMAC key, for the proofs and the nonce tags.
#[derive(Clone)]
pub struct ProofKey {
    mac: HmacSha256,
}

impl std::fmt::Debug for ProofKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ProofKey(<redacted>)")
    }
}

impl ProofKey {
    pub fn new(secret: &[u8]) -> ProofKey {
        ProofKey {
            mac: <HmacSha256 as KeyInit>::new_from_slice(secret)
                .expect("HMAC takes a key of any length"),
        }
    }

    fn keyed(&self, context: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(context);
        mac
    }

    /// What the router answers a challenge with: proof that it holds the site secret, bound to
    /// the agent's nonce (no replay), its own nonce and its peer ID (no reuse by another router).
    pub fn router_proof(
        &self,
        agent_nonce: &[u8],
        router_nonce: &[u8],
        router_peer_id: &str,
    ) -> [u8; 32] {
        self.router_proof_mac(agent_nonce, router_nonce, router_peer_id)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The agent's check of [`router_proof`](ProofKey::router_proof), in constant time.
    pub fn router_proof_holds(
        &self,
        agent_nonce: &[u8],
        router_nonce: &[u8],
        router_peer_id: &str,
        proof: &[u8],
    ) -> bool {
        self.router_proof_mac(agent_nonce, router_nonce, router_peer_id)
            .verify_slice(proof)
            .is_ok()
    }

    fn router_proof_mac(
        &self,
        agent_nonce: &[u8],
        router_nonce: &[u8],
        router_peer_id: &str,
    ) -> HmacSha256 {
        let mut mac = self.keyed(ROUTER_PROOF_CONTEXT);
        update_framed(&mut mac, agent_nonce);
        update_framed(&mut mac, router_nonce);
        update_framed(&mut mac, router_peer_id.as_bytes());
        mac
    }

    /// A router's answer to a challenge: a new nonce, and the proof over it and `agent_nonce`.
    pub fn answer(
        &self,
        router_peer_id: &str,
        agent_nonce: &[u8],
        now_unix_ms: u64,
    ) -> ([u8; ROUTER_NONCE_LEN], [u8; 32]) {
        let router_nonce = self.issue_nonce(router_peer_id, now_unix_ms);
        let proof = self.router_proof(agent_nonce, &router_nonce, router_peer_id);
        (router_nonce, proof)
    }

    /// A new router nonce issued at `now_unix_ms` by `router_peer_id`.
    pub fn issue_nonce(&self, router_peer_id: &str, now_unix_ms: u64) -> [u8; ROUTER_NONCE_LEN] {
        let mut nonce = [0u8; ROUTER_NONCE_LEN];
        nonce[..8].copy_from_slice(&now_unix_ms.to_be_bytes());
        nonce[8..24].copy_from_slice(&random_bytes::<16>());
        let tag = self.nonce_tag(&nonce[..24], router_peer_id);
        nonce[24..].copy_from_slice(&tag);
        nonce
    }

    /// Checks that `nonce` is one `router_peer_id` issued with this secret and is not older than
    /// [`NONCE_TTL`]; returns what the [`NonceLedger`] spends.
    pub fn check_nonce(
        &self,
        nonce: &[u8],
        router_peer_id: &str,
        now_unix_ms: u64,
    ) -> Result<IssuedNonce, ChallengeError> {
        let nonce: &[u8; ROUTER_NONCE_LEN] =
            nonce.try_into().map_err(|_| ChallengeError::ForeignNonce)?;
        self.nonce_mac(&nonce[..24], router_peer_id)
            .verify_truncated_left(&nonce[24..])
            .map_err(|_| ChallengeError::ForeignNonce)?;
        let issued_unix_ms = u64::from_be_bytes(nonce[..8].try_into().expect("8 bytes"));
        // A nonce from the future (a clock stepped back) is as old as it claims to be: it
        // expires NONCE_TTL after its issue time, never later.
        if now_unix_ms.saturating_sub(issued_unix_ms) > NONCE_TTL.as_millis() as u64 {
            return Err(ChallengeError::ExpiredNonce);
        }
        Ok(IssuedNonce {
            random: nonce[8..24].try_into().expect("16 bytes"),
            issued_unix_ms,
        })
    }

    fn nonce_tag(&self, head: &[u8], router_peer_id: &str) -> [u8; TAG_LEN] {
        let full = self.nonce_mac(head, router_peer_id).finalize().into_bytes();
        full[..TAG_LEN].try_into().expect("16 bytes")
    }

    fn nonce_mac(&self, head: &[u8], router_peer_id: &str) -> HmacSha256 {
        let mut mac = self.keyed(ROUTER_NONCE_CONTEXT);
        update_framed(&mut mac, head);
        update_framed(&mut mac, router_peer_id.as_bytes());
        mac
    }
}

/// Each field with its length first, so no two different field lists hash alike.
fn update_framed(mac: &mut HmacSha256, field: &[u8]) {
    mac.update(&(field.len() as u32).to_be_bytes());
    mac.update(field);
}

/// A router nonce that passed [`ProofKey::check_nonce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuedNonce {
    random: [u8; 16],
    issued_unix_ms: u64,
}

/// The router nonces already spent, each kept until it could no longer pass
/// [`ProofKey::check_nonce`].
#[derive(Debug, Default)]
pub struct NonceLedger {
    /// Random part of the nonce -> when it expires (Unix ms).
    spent: HashMap<[u8; 16], u64>,
    capacity: usize,
}

impl NonceLedger {
    pub fn new(capacity: usize) -> NonceLedger {
        NonceLedger {
            spent: HashMap::new(),
            capacity,
        }
    }

    /// Spends `nonce`: `Ok` the first time, [`ChallengeError::SpentNonce`] after. When the ledger
    /// is full of nonces that have not expired yet, the nonce is refused
    /// ([`ChallengeError::LedgerFull`]) rather than forgetting one that could be replayed.
    pub fn spend(&mut self, nonce: IssuedNonce, now_unix_ms: u64) -> Result<(), ChallengeError> {
        if self.spent.contains_key(&nonce.random) {
            return Err(ChallengeError::SpentNonce);
        }
        if self.spent.len() >= self.capacity {
            self.spent.retain(|_, expires| *expires > now_unix_ms);
            if self.spent.len() >= self.capacity {
                return Err(ChallengeError::LedgerFull);
            }
        }
        let expires = nonce.issued_unix_ms + NONCE_TTL.as_millis() as u64 + 1;
        self.spent.insert(nonce.random, expires);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.spent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spent.is_empty()
    }
}

fn agent_proof_message(router_nonce: &[u8], router_peer_id: &str) -> Vec<u8> {
    let mut message =
        Vec::with_capacity(AGENT_PROOF_CONTEXT.len() + router_nonce.len() + router_peer_id.len());
    message.extend_from_slice(AGENT_PROOF_CONTEXT);
    message.extend_from_slice(&(router_nonce.len() as u32).to_be_bytes());
    message.extend_from_slice(router_nonce);
    message.extend_from_slice(router_peer_id.as_bytes());
    message
}

/// The agent's proof that it holds the key of its peer ID: its identity key's signature over
/// the router's nonce and peer ID. Returns the public key (protobuf encoding) and the signature.
pub fn agent_proof(keypair: &Keypair, router_nonce: &[u8], router_peer_id: &str) -> AgentProof {
    let signature = keypair
        .sign(&agent_proof_message(router_nonce, router_peer_id))
        .expect("Ed25519 signing cannot fail");
    AgentProof {
        public_key: keypair.public().encode_protobuf(),
        signature,
    }
}

pub struct AgentProof {
    pub public_key: Vec<u8>,
    pub signature: Vec<u8>,
}

/// The router's check of [`agent_proof`]: the key hashes to `peer_id` and made the signature.
pub fn check_agent_proof(
    peer_id: &str,
    public_key: &[u8],
    signature: &[u8],
    router_nonce: &[u8],
    router_peer_id: &str,
) -> Result<(), ChallengeError> {
    let key =
        PublicKey::try_decode_protobuf(public_key).map_err(|_| ChallengeError::BadPublicKey)?;
    let claimed: PeerId = peer_id.parse().map_err(|_| ChallengeError::KeyNotPeer)?;
    if key.to_peer_id() != claimed {
        return Err(ChallengeError::KeyNotPeer);
    }
    if !key.verify(
        &agent_proof_message(router_nonce, router_peer_id),
        signature,
    ) {
        return Err(ChallengeError::BadSignature);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const ROUTER: &str = "12D3KooWrouter";

    #[test]
    fn only_the_secret_makes_the_router_proof() {
        let site = ProofKey::new(b"site-secret");
        let impostor = ProofKey::new(b"guessed");
        let agent_nonce = random_bytes::<AGENT_NONCE_LEN>();
        let router_nonce = site.issue_nonce(ROUTER, NOW);
        let proof = site.router_proof(&agent_nonce, &router_nonce, ROUTER);
        assert!(site.router_proof_holds(&agent_nonce, &router_nonce, ROUTER, &proof));
        let forged = impostor.router_proof(&agent_nonce, &router_nonce, ROUTER);
        assert!(!site.router_proof_holds(&agent_nonce, &router_nonce, ROUTER, &forged));
        // A proof made for one agent nonce, router nonce or router does not pass for another.
        let other_nonce = random_bytes::<AGENT_NONCE_LEN>();
        assert!(!site.router_proof_holds(&other_nonce, &router_nonce, ROUTER, &proof));
        let other_router_nonce = site.issue_nonce(ROUTER, NOW);
        assert!(!site.router_proof_holds(&agent_nonce, &other_router_nonce, ROUTER, &proof));
        assert!(!site.router_proof_holds(&agent_nonce, &router_nonce, "12D3KooWother", &proof));
        assert!(!site.router_proof_holds(&agent_nonce, &router_nonce, ROUTER, &proof[..31]));
        assert!(!format!("{site:?}").contains("site-secret"));
    }

    #[test]
    fn a_router_accepts_only_its_own_fresh_nonces() {
        let site = ProofKey::new(b"site-secret");
        let nonce = site.issue_nonce(ROUTER, NOW);
        assert!(site.check_nonce(&nonce, ROUTER, NOW + 1_000).is_ok());
        assert!(site.check_nonce(&nonce, ROUTER, NOW + 30_000).is_ok());
        assert_eq!(
            site.check_nonce(&nonce, ROUTER, NOW + 30_001),
            Err(ChallengeError::ExpiredNonce)
        );
        // Another router's nonce, the same router's under another secret, a tampered one.
        assert_eq!(
            site.check_nonce(&nonce, "12D3KooWother", NOW),
            Err(ChallengeError::ForeignNonce)
        );
        let other_site = ProofKey::new(b"other");
        assert_eq!(
            other_site.check_nonce(&nonce, ROUTER, NOW),
            Err(ChallengeError::ForeignNonce)
        );
        let mut later = nonce;
        later[..8].copy_from_slice(&(NOW + 60_000).to_be_bytes());
        assert_eq!(
            site.check_nonce(&later, ROUTER, NOW + 60_000),
            Err(ChallengeError::ForeignNonce)
        );
        assert_eq!(
            site.check_nonce(&nonce[..39], ROUTER, NOW),
            Err(ChallengeError::ForeignNonce)
        );
    }

    #[test]
    fn a_nonce_is_spent_once_and_forgotten_only_after_it_expired() {
        let site = ProofKey::new(b"site-secret");
        let mut ledger = NonceLedger::new(2);
        let first = site
            .check_nonce(&site.issue_nonce(ROUTER, NOW), ROUTER, NOW)
            .unwrap();
        let second = site
            .check_nonce(&site.issue_nonce(ROUTER, NOW), ROUTER, NOW)
            .unwrap();
        let third = site
            .check_nonce(&site.issue_nonce(ROUTER, NOW), ROUTER, NOW)
            .unwrap();
        assert_eq!(ledger.spend(first, NOW), Ok(()));
        assert_eq!(
            ledger.spend(first, NOW + 1),
            Err(ChallengeError::SpentNonce)
        );
        assert_eq!(ledger.spend(second, NOW + 1), Ok(()));
        // Full of nonces that could still be replayed: refuse, never forget one.
        assert_eq!(
            ledger.spend(third, NOW + 2),
            Err(ChallengeError::LedgerFull)
        );
        assert_eq!(
            ledger.spend(first, NOW + 2),
            Err(ChallengeError::SpentNonce)
        );
        // Once they expired they can go: a replay would fail its age check anyway.
        let late = NOW + NONCE_TTL.as_millis() as u64 + 1;
        assert_eq!(ledger.spend(third, late), Ok(()));
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn the_agent_proof_needs_the_peer_ids_key() {
        let agent = Keypair::generate_ed25519();
        let peer_id = agent.public().to_peer_id().to_string();
        let nonce = ProofKey::new(b"s").issue_nonce(ROUTER, NOW);
        let proof = agent_proof(&agent, &nonce, ROUTER);
        assert_eq!(
            check_agent_proof(
                &peer_id,
                &proof.public_key,
                &proof.signature,
                &nonce,
                ROUTER
            ),
            Ok(())
        );
        // Another router, another nonce: the signature was not made for them.
        assert_eq!(
            check_agent_proof(
                &peer_id,
                &proof.public_key,
                &proof.signature,
                &nonce,
                "12D3KooWx"
            ),
            Err(ChallengeError::BadSignature)
        );
        let other_nonce = ProofKey::new(b"s").issue_nonce(ROUTER, NOW);
        assert_eq!(
            check_agent_proof(
                &peer_id,
                &proof.public_key,
                &proof.signature,
                &other_nonce,
                ROUTER
            ),
            Err(ChallengeError::BadSignature)
        );
        // An attacker's own key, presented for the victim's peer ID.
        let attacker = Keypair::generate_ed25519();
        let forged = agent_proof(&attacker, &nonce, ROUTER);
        assert_eq!(
            check_agent_proof(
                &peer_id,
                &forged.public_key,
                &forged.signature,
                &nonce,
                ROUTER
            ),
            Err(ChallengeError::KeyNotPeer)
        );
        assert_eq!(
            check_agent_proof(&peer_id, b"junk", &proof.signature, &nonce, ROUTER),
            Err(ChallengeError::BadPublicKey)
        );
    }
}

//! Invariant 5: "A cross-site redirect token is accepted once by the whole site, not once per
//! router" (seed `run-several-routers.md`, "What is shared"); "Redirect tokens while the store is
//! unreachable: each router checks single use on its own".
//!
//! Clients present redirect tokens to the routers, and replay some of them, on the same router
//! or another, while the faults of the run go on. Each router decides as `api::redirect` does:
//! its own check first (`SpentTokens`, the owner shard's, lost with the process), then the site's
//! (`redirect_claims::Spend`): the claim is a `SET NX` in the store, answered in time unless the
//! store is down, slow or cut off from that router, or the answer is lost; the store's claims are
//! lost with its data and in a failover to a replica that missed them.
//!
//! A token accepted twice is a failure unless one of the two was decided by a router's own check
//! while the store did not answer that router in time, or the store lost its claim between the
//! two. Before every claim went to the store, a router whose view said unreachable decided alone
//! without asking: from its start until its first round (the view starts unreachable), and for
//! up to a round after the store came back; a token replayed on two routers then was accepted
//! twice while the store answered both (397 of the first 400 seeds, most in the first second).
//!
//! Its own generator: the rest of a seed's run is the same with it as without it.

use super::*;
use crate::router::shard::redirect_claims::Spend;

/// How long a token is good (the token's `exp`), and the store keeps its claim.
const TOKEN_TTL_MS: u64 = 30_000;

/// The tokens presented so far, and what became of them.
pub(super) struct Redirects {
    rng: Rng,
    next_nonce: u128,
    /// The latest tokens presented: nonce, expiry (the issuing site's clock, here the
    /// simulation's).
    recent: std::collections::VecDeque<(u128, u64)>,
    /// Per token, each acceptance: (router, time, how the site decided, whether the store
    /// answered that router's claim in time).
    accepted: HashMap<u128, Vec<(usize, u64, Spend, bool)>>,
    /// When the store lost claims (restarted without its data, or failed over).
    losses: Vec<u64>,
    /// Tokens presented, accepted, refused for now (`redirect_token_unchecked`), refused as used.
    pub counts: [u64; 4],
    /// The first failure of invariant 5.
    pub failure: Option<String>,
}

impl Redirects {
    pub fn new(seed: u64) -> Redirects {
        Redirects {
            rng: Rng(seed ^ 0x5eed_0005_0005_0005),
            next_nonce: 0,
            recent: std::collections::VecDeque::new(),
            accepted: HashMap::new(),
            losses: Vec::new(),
            counts: [0; 4],
            failure: None,
        }
    }

    /// The store lost its claims now.
    pub fn store_lost_claims(&mut self, now: u64) {
        self.losses.push(now);
    }
}

impl Sim {
    /// Clients present a new token now and then, and replay a recent one now and then.
    pub(super) fn redirect(&mut self) {
        let now = self.now;
        let redirects = &mut self.redirects;
        let mut presented = Vec::new();
        if redirects.rng.chance(300) {
            redirects.next_nonce += 1;
            let token = (redirects.next_nonce, now + TOKEN_TTL_MS);
            redirects.recent.push_back(token);
            if redirects.recent.len() > 40 {
                redirects.recent.pop_front();
            }
            presented.push(token);
        }
        if redirects.rng.chance(400) && !redirects.recent.is_empty() {
            let pick = redirects.rng.below(redirects.recent.len() as u64) as usize;
            presented.push(redirects.recent[pick]);
        }
        for (nonce, expires) in presented {
            if expires <= now {
                continue;
            }
            let index = self.redirects.rng.below(ROUTERS as u64) as usize;
            if self.routers[index].is_some() {
                self.present(index, nonce, expires);
            }
        }
    }

    /// Router `index` decides on the token `nonce` (`api::redirect::authenticate`).
    fn present(&mut self, index: usize, nonce: u128, expires: u64) {
        let now = self.now;
        let lose_answer = self.redirects.rng.chance(20);
        let router = self.routers[index].as_mut().expect("a running router");
        self.redirects.counts[0] += 1;
        let wall = router.wall(now) as i64;
        // The token's expiry as this router's clock reads the issuer's: offsets only move it.
        if !router.spent.spend(
            nonce.to_le_bytes(),
            expires as i64,
            wall.min(expires as i64 - 1),
        ) {
            self.redirects.counts[3] += 1;
            return;
        }
        // The claim, on the sync core's connection (`sync::redirect_claims`).
        let reachable = now >= self.store.down_until && now >= router.partitioned_until;
        let in_time = reachable && now >= self.store.slow_until && !lose_answer;
        let answer = reachable.then(|| {
            let claims = &mut self.store.primary.tokens;
            let first = claims.get(&nonce).is_none_or(|kept| *kept <= now);
            if first {
                claims.insert(nonce, now + TOKEN_TTL_MS);
            }
            first
        });
        let spend = Spend::of(answer.filter(|_| in_time), router.health.is_up());
        let decided = spend.accepts();
        let run = router.run;
        self.log(|| {
            format!("router-{index} (run {run}): redirect token {nonce}: {spend:?}, {decided:?}")
        });
        match decided {
            None => self.redirects.counts[2] += 1,
            Some(false) => self.redirects.counts[3] += 1,
            Some(true) => {
                self.redirects.counts[1] += 1;
                self.accepted_once(index, nonce, spend, in_time);
            }
        }
    }

    /// Invariant 5 on an acceptance; `answered`: the store answered this claim in time.
    fn accepted_once(&mut self, index: usize, nonce: u128, spend: Spend, answered: bool) {
        let now = self.now;
        let redirects = &mut self.redirects;
        let before = redirects.accepted.entry(nonce).or_default();
        // Decided by a router's own check while the store did not answer it in time.
        let alone = |how: Spend, answered: bool| how == Spend::Unchecked && !answered;
        for &(other, at, how, answered_then) in before.iter() {
            let unchecked = alone(how, answered_then) || alone(spend, answered);
            let lost = redirects
                .losses
                .iter()
                .any(|lost| (at..=now).contains(lost));
            if !unchecked && !lost && redirects.failure.is_none() {
                redirects.failure = Some(format!(
                    "invariant 5: redirect token {nonce} accepted by router-{other} at {at} ms ({how:?}) and by router-{index} at {now} ms ({spend:?}), the store answering both"
                ));
            }
        }
        before.push((index, now, spend, answered));
    }
}

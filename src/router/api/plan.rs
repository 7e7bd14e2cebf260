//! The visit plan: which owners an inference request visits during admission, in which order,
//! and what each visit asks — decided once, from the route, the key and the model's entry
//! (`docs/request-path.md`, "Admission visits").
//!
//! Owns: the rule that turns the seed's gate order (RPM, B1, B3, B2, B4 share, B4 token buckets,
//! daily) into as few visits as that order allows. RPM and the key's token phase live on the
//! key's quota owner; B3, B2 and the B4 share on the model's owner; B1 on the request's own
//! shard. A model with no gate between RPM and the token phase gets both in one quota visit; in
//! the gate order, a model with pool gates and a key with a token phase gets the gates first (a
//! reservation), then the token phase, then the slot, unless the tokens are charged ahead
//! (below); without a token phase the gates and the slot share one visit.
//!
//! Tokens ahead: where the token phase would be a visit of its own after B1 or the pool gates,
//! it is charged in the first quota visit instead, with the request rate ([`RateCharge::Ahead`]),
//! and the gates take the slot in one visit ([`SlotAdmit::Ahead`]): two visits where the gate
//! order needs four (three with B1 alone). The gate order still decides every answer. The charge ahead is given back
//! where the token phase would not have run yet: B1 refuses, the gates refuse, or B2 would park
//! the request (the owner then answers that it would park, instead of parking it). When the key
//! has no room for the tokens, the charge ahead takes nothing and refuses nothing. In these two
//! last cases the rest of the request goes the gate order's way ([`VisitPlan::in_order`]): the
//! gates' reservation (parking), then the token phase in its own visit, where it is refused in
//! its place, then the slot. What the order changes is when the tokens are charged: a request
//! the gates refuse held its tokens for one visit to the model's owner.
//!
//! Hold at zero waits on the model's owner after B1 and after the whole quota (request rate,
//! token buckets, daily budget: a key over its limits is refused before it is held), and a
//! request a wake released always reserves first, so that its wait for room is bounded by its
//! hold budget and its wait for a slot by the request timeout.
//!
//! Must not: do I/O, read the clock or touch a shard. The phases (`api::infer`) follow the plan;
//! the shard's requester API (`Shard::admit_quota`, `reserve`, `hold`, `acquire`) makes the
//! visits.
//!
//! Invariants: the slot visit is always last and always present; a token visit comes only after
//! a first quota visit that charged requests alone; a reservation comes only with pool gates and
//! is followed by a slot visit that brings it; a plan that charges the tokens ahead has no hold,
//! and its [`VisitPlan::in_order`] is the plan the gate order alone would give.

use std::time::Duration;

use crate::logic::admission;
use crate::logic::auth::keys::KeyRecord;
use crate::logic::snapshot::ModelEntry;
use crate::router::shard::owner::quotas::{has_token_phase, is_limited};
use crate::wire::http::route::Route;

/// What the first visit to the key's quota owner charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateCharge {
    /// The request rate alone: a gate comes before the token phase, or the route charges no
    /// tokens (`count_tokens`, embeddings, rerank).
    Requests,
    /// The request rate and the token phase in one visit: nothing gates between them.
    RequestsAndTokens,
    /// The request rate, and the token phase ahead of the gates between them (see the module
    /// docs): a token phase the key has no room for charges nothing and refuses nothing.
    Ahead,
}

/// How the model's owner admits the request's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotAdmit {
    /// No pool gate: straight to the capacity queue (`Admit::Direct`).
    Direct,
    /// The pool gates and the slot in one visit (`Admit::Gated`).
    Gated,
    /// With the reservation an earlier visit took (`Admit::Reserved`).
    Reserved,
    /// The pool gates and the slot in one visit, after a token phase charged ahead: where B2
    /// would park the request the owner says so instead (`PoolAsk::bounce_park`).
    Ahead,
}

/// Where the key's token phase (B4's token buckets and the daily budget) is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPhase {
    /// Nowhere apart: the route charges no tokens, or the key has no token phase here.
    None,
    /// In the first quota visit, with the request rate: nothing gates between them.
    WithRequests,
    /// In the first quota visit, ahead of the gates between them (see the module docs).
    Ahead,
    /// In a visit of its own before the hold (B1 split it from the request rate; a request
    /// that may be held has its whole quota checked first).
    BeforeHold,
    /// In a visit of its own after B1 or the pool gates' reservation.
    AfterGates,
}

/// One step of the admission phases, in the order the request takes them: a visit to an owner,
/// or B1 on the request's own shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The key's quota owner (phase 5).
    Quota(RateCharge),
    /// B1's caps, on the request's own shard (phase 5a).
    RequestCaps,
    /// The model's owner's hold book: wait for the model to wake (phase 5h).
    Hold,
    /// The model's owner: the pool gates, reserving occupancy without a slot (phase 5b).
    Reserve,
    /// The key's quota owner again: the token phase alone (phase 5d).
    Tokens,
    /// The model's owner: a slot (phase 6).
    Slot(SlotAdmit),
}

/// Where the pool gates run, when the model has any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolGates {
    /// No pool gate for this request.
    None,
    /// In the slot's visit.
    WithSlot,
    /// In a visit of their own that reserves, before the token phase or after a hold; with the
    /// tokens charged ahead, in the slot's visit instead ([`SlotAdmit::Ahead`]), and in their own
    /// visit again if the request then takes the gate order's way.
    Reserve,
}

/// Which owners a request visits and what each visit asks; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisitPlan {
    /// The route generates text (chat, messages): admission control and the policy counters
    /// apply only to these (seed: `count_tokens`, embeddings and rerank are exempt).
    pub generates: bool,
    /// The model is serverless for this request (B4 applies).
    pub serverless: bool,
    /// The key has a limit at all; without one `Shard::admit_quota` answers on this shard and
    /// the quota owner is never visited.
    pub limited: bool,
    /// B1 has a cap to check, on the request's shard, after the first quota visit.
    pub request_caps: bool,
    /// Hold at zero: the model is placed here with `scale_from_zero` and has no agent; the
    /// request is held up to this budget (from its arrival) after B1.
    pub hold_budget: Option<Duration>,
    /// Where the pool gates run.
    pub gates: PoolGates,
    /// The key's `max_occupancy_share` of a serverless model with an occupancy budget; 0
    /// otherwise.
    pub share: f64,
    /// Where the token phase is charged.
    pub tokens: TokenPhase,
    /// When no local slot is found, the policy's `fallback_provider` answers (non-streamed
    /// chat and messages, with a provider client configured).
    pub provider_fallback: bool,
    /// The places of the way this plan has a step at, one bit each ([`VisitPlan::next_step`]);
    /// set where the plan is made ([`VisitPlan::of`], [`VisitPlan::in_order`]).
    way: u8,
}

/// Hold at zero applies to `entry` on `route`: its budget. `count_tokens` is never held (it
/// would count each prompt twice in the demand).
pub fn hold_budget(route: Route, entry: &ModelEntry) -> Option<Duration> {
    entry.hold_budget.filter(|_| route != Route::CountTokens)
}

impl VisitPlan {
    /// The plan of a request on `route` with `key` for the model `entry`; `stream` as the body
    /// asks, `provider_configured` when this router runs a provider client. A request that
    /// arrived by a cross-site redirect is planned like any other, by the key its token names.
    pub fn of(
        route: Route,
        key: &KeyRecord,
        entry: &ModelEntry,
        stream: bool,
        provider_configured: bool,
    ) -> VisitPlan {
        let policy = &entry.policy;
        let generates = matches!(route, Route::ChatCompletions | Route::Messages);
        let serverless = generates && admission::is_serverless(policy);
        let share = match key.settings.max_occupancy_share() {
            Some(share) if serverless && policy.admit_budget_tokens > 0 => share,
            _ => 0.0,
        };
        let request_caps = generates && admission::caps_requests(policy);
        let pool_gates = generates && (admission::gates_pool(policy) || share > 0.0);
        let hold_budget = hold_budget(route, entry).filter(|_| entry.healthy_agents == 0);
        // The gate order is RPM, B1, B3, B2, B4, daily: with a gate between them, the request
        // rate and the token phase are two visits. A request that may be held has its whole
        // quota checked before the hold (seed `hold-at-zero.md`, step 4: "a key over its limits
        // is refused at once"), so its pool gates, which run after the release, split nothing.
        let split = request_caps || (pool_gates && hold_budget.is_none());
        let token_visit = split && has_token_phase(key, serverless);
        let limited = is_limited(key);
        let tokens = match (token_visit, hold_budget.is_some()) {
            (false, _) if generates && !split => TokenPhase::WithRequests,
            (false, _) => TokenPhase::None,
            (true, true) => TokenPhase::BeforeHold,
            (true, false) if limited => TokenPhase::Ahead,
            (true, false) => TokenPhase::AfterGates,
        };
        let gates = match (pool_gates, token_visit || hold_budget.is_some()) {
            (false, _) => PoolGates::None,
            (true, false) => PoolGates::WithSlot,
            (true, true) => PoolGates::Reserve,
        };
        let plan = VisitPlan {
            generates,
            serverless,
            limited,
            request_caps,
            hold_budget,
            gates,
            share,
            tokens,
            provider_fallback: generates
                && !stream
                && provider_configured
                && policy.fallback_provider.is_some(),
            way: 0,
        };
        plan.with_way()
    }

    /// What the first quota visit charges.
    pub fn rate(&self) -> RateCharge {
        match self.tokens {
            TokenPhase::WithRequests => RateCharge::RequestsAndTokens,
            TokenPhase::Ahead => RateCharge::Ahead,
            TokenPhase::None | TokenPhase::BeforeHold | TokenPhase::AfterGates => {
                RateCharge::Requests
            }
        }
    }

    /// How the first slot visit is admitted.
    pub fn slot(&self) -> SlotAdmit {
        match self.gates {
            PoolGates::None => SlotAdmit::Direct,
            PoolGates::WithSlot => SlotAdmit::Gated,
            PoolGates::Reserve if self.tokens == TokenPhase::Ahead => SlotAdmit::Ahead,
            PoolGates::Reserve => SlotAdmit::Reserved,
        }
    }

    /// The rest of a request whose token phase ahead did not stay charged (the key had no room,
    /// or B2 would park the request), in the gate order: the gates' own visit (parking), the
    /// token phase, the slot. Its first quota visit is done; [`VisitPlan::steps`] lists it as
    /// charging the request rate alone, which is what it charged.
    pub fn in_order(self) -> VisitPlan {
        VisitPlan {
            tokens: match self.tokens {
                TokenPhase::Ahead => TokenPhase::AfterGates,
                tokens => tokens,
            },
            ..self
        }
        .with_way()
    }

    /// How a slot visit after a failed forward is admitted: the first slot gave its
    /// reservation back, so the gates run again with the slot.
    pub fn retry_slot(&self) -> SlotAdmit {
        match self.gates {
            PoolGates::None => SlotAdmit::Direct,
            PoolGates::WithSlot | PoolGates::Reserve => SlotAdmit::Gated,
        }
    }

    /// The request is held at zero before its slot.
    pub fn holds(&self) -> bool {
        self.hold_budget.is_some()
    }

    /// The plan with its way set: one bit per place of the way through admission, each place a
    /// step the gate order knows, set where this plan has that step. The places stay put when a
    /// plan changes its way ([`VisitPlan::in_order`]), so a request keeps its [`Place`].
    fn with_way(self) -> VisitPlan {
        let places = [
            self.limited,
            self.request_caps,
            self.tokens == TokenPhase::BeforeHold,
            self.hold_budget.is_some(),
            self.gates == PoolGates::Reserve && self.tokens != TokenPhase::Ahead,
            self.tokens == TokenPhase::AfterGates,
            true,
        ];
        let way = places.iter().enumerate().fold(0, |way, (place, present)| {
            way | (u8::from(*present) << place)
        });
        VisitPlan { way, ..self }
    }

    /// The step at or after `place`, and `place` moved past it; `None` once the slot is passed.
    /// The phases (`api::infer`) take their steps from here.
    #[inline]
    pub fn next_step(&self, place: &mut Place) -> Option<Step> {
        let ahead = self.way.checked_shr(u32::from(place.0)).unwrap_or(0);
        if ahead == 0 {
            place.0 = Place::END.0;
            return None;
        }
        let at = place.0 + ahead.trailing_zeros() as u8;
        place.0 = at + 1;
        Some(match at {
            0 => Step::Quota(self.rate()),
            1 => Step::RequestCaps,
            2 | 5 => Step::Tokens,
            3 => Step::Hold,
            4 => Step::Reserve,
            _ => Step::Slot(self.slot()),
        })
    }

    /// The steps of a request that is not refused on the way, in order, up to its first slot.
    pub fn steps(self) -> impl Iterator<Item = Step> {
        let mut place = Place::START;
        std::iter::from_fn(move || self.next_step(&mut place))
    }
}

/// Where a request is on its plan's way: the place of its next step. One byte, so the phases
/// keep it across their waits at no cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place(u8);

impl Place {
    /// Before the first quota visit.
    pub const START: Place = Place(0);
    /// Before the pool gates' own visit: where a request whose slot visit found that B2 would
    /// park it takes the gate order's way again.
    pub const GATES: Place = Place(4);
    /// Past the slot.
    const END: Place = Place(7);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::auth::config::AuthConfig;
    use crate::logic::auth::keys::{AuthOutcome, KeyRegistry};
    use crate::logic::policy::{Mode, ModelPolicy, ProviderEngine, ProviderFallback};
    use crate::logic::snapshot::ModelId;

    use RateCharge::{Ahead, Requests, RequestsAndTokens};
    use SlotAdmit::{Direct, Gated, Reserved};
    use Step::{Hold, Quota, RequestCaps, Reserve, Slot, Tokens};

    const NOW_MS: i64 = 1_785_153_600_000;

    /// One key per quota shape the plan tells apart.
    const AUTH: &str = r#"
api:
  mode: api-key
  keys:
    - key_hash: "HASH:sk-none"
      key_preview: "sk-...none"
      metadata: {name: "none", owner: "none"}
    - key_hash: "HASH:sk-rpm"
      key_preview: "sk-...rpm"
      metadata: {name: "rpm", owner: "rpm"}
      quota: {requests_per_minute: 60}
    - key_hash: "HASH:sk-daily"
      key_preview: "sk-...daily"
      metadata: {name: "daily", owner: "daily"}
      quota: {requests_per_minute: 60, tokens_per_day: 100000}
    - key_hash: "HASH:sk-itpm"
      key_preview: "sk-...itpm"
      metadata: {name: "itpm", owner: "itpm"}
      quota: {input_tokens_per_minute: 50000}
    - key_hash: "HASH:sk-share"
      key_preview: "sk-...share"
      metadata: {name: "share", owner: "share"}
      max_occupancy_share: 0.25
    - key_hash: "HASH:sk-model-rpm"
      key_preview: "sk-...model-rpm"
      metadata: {name: "model-rpm", owner: "model-rpm"}
      quota:
        per_model:
          m: {requests_per_minute_per_replica: 10, tokens_per_day: 0}
    - key_hash: "HASH:sk-model-daily"
      key_preview: "sk-...model-daily"
      metadata: {name: "model-daily", owner: "model-daily"}
      quota:
        per_model:
          m: {requests_per_minute_per_replica: 0, tokens_per_day: 1000}
"#;

    fn registry() -> KeyRegistry {
        let mut text = AUTH.to_string();
        for raw in [
            "sk-none",
            "sk-rpm",
            "sk-daily",
            "sk-itpm",
            "sk-share",
            "sk-model-rpm",
            "sk-model-daily",
        ] {
            text = text.replace(
                &format!("HASH:{raw}\""),
                &format!("{}\"", crate::logic::auth::key_hash::hash_key_hex(raw)),
            );
        }
        KeyRegistry::from_config(&AuthConfig::from_yaml(&text).expect("test auth.yaml"))
    }

    fn key<'r>(registry: &'r KeyRegistry, raw: &str) -> &'r KeyRecord {
        match registry.authenticate(Some(raw.as_bytes()), NOW_MS) {
            AuthOutcome::Authenticated { key, .. } => key,
            _ => panic!("{raw} does not authenticate"),
        }
    }

    /// The policy with no limit at all.
    fn open() -> ModelPolicy {
        ModelPolicy::built_in(&Default::default())
    }

    /// B2 only (an occupancy budget), reserved.
    fn budget() -> ModelPolicy {
        ModelPolicy {
            admit_budget_tokens: 100_000,
            ..open()
        }
    }

    /// B2's request backstop only, reserved.
    fn inflight() -> ModelPolicy {
        ModelPolicy {
            max_inflight: 8,
            ..open()
        }
    }

    /// B1 only.
    fn caps() -> ModelPolicy {
        ModelPolicy {
            max_input_tokens: 4096,
            ..open()
        }
    }

    fn serverless(policy: ModelPolicy) -> ModelPolicy {
        ModelPolicy {
            mode: Mode::Serverless,
            ..policy
        }
    }

    fn with_provider(policy: ModelPolicy) -> ModelPolicy {
        ModelPolicy {
            fallback_provider: Some(ProviderFallback {
                engine: ProviderEngine::OpenAi,
                model: "gpt-4o-mini".into(),
            }),
            ..policy
        }
    }

    fn entry(policy: ModelPolicy, healthy_agents: u32, hold_secs: Option<u64>) -> ModelEntry {
        ModelEntry {
            id: ModelId(0),
            owner_shard: 0,
            healthy_agents,
            policy: std::sync::Arc::new(policy),
            hold_budget: hold_secs.map(Duration::from_secs),
            tokens_per_byte: Default::default(),
        }
    }

    /// The plan of a non-streamed request, on a router without a provider client.
    fn plan(route: Route, raw_key: &str, entry: &ModelEntry) -> VisitPlan {
        VisitPlan::of(route, key(&registry(), raw_key), entry, false, false)
    }

    fn visits(plan: &VisitPlan) -> Vec<Step> {
        plan.steps().collect()
    }

    #[test]
    fn no_gate_one_quota_visit_then_the_slot() {
        let up = entry(open(), 2, None);
        for raw in ["sk-rpm", "sk-daily", "sk-itpm", "sk-model-daily"] {
            let plan = plan(Route::ChatCompletions, raw, &up);
            assert_eq!(
                visits(&plan),
                [Quota(RequestsAndTokens), Slot(Direct)],
                "{raw}"
            );
            assert_eq!(plan.tokens, TokenPhase::WithRequests, "{raw}");
            assert!(!plan.request_caps && plan.gates == PoolGates::None);
        }
        // Serverless without an occupancy budget or cap gates nothing either.
        let plan = plan(
            Route::Messages,
            "sk-itpm",
            &entry(serverless(open()), 1, None),
        );
        assert_eq!(visits(&plan), [Quota(RequestsAndTokens), Slot(Direct)]);
        assert!(plan.serverless);
    }

    #[test]
    fn pool_gates_and_a_daily_budget_charge_the_tokens_ahead_or_reserve_between_two_quota_visits() {
        for policy in [budget(), inflight(), serverless(budget())] {
            for raw in ["sk-daily", "sk-model-daily"] {
                let plan = plan(Route::ChatCompletions, raw, &entry(policy.clone(), 1, None));
                assert_eq!(
                    visits(&plan),
                    [Quota(Ahead), Slot(SlotAdmit::Ahead)],
                    "{raw}"
                );
                // The gate order's way, where the tokens did not stay charged ahead.
                let in_order = plan.in_order();
                assert_eq!(
                    visits(&in_order),
                    [Quota(Requests), Reserve, Tokens, Slot(Reserved)],
                    "{raw}"
                );
                assert_eq!(
                    (plan.tokens, in_order.tokens),
                    (TokenPhase::Ahead, TokenPhase::AfterGates)
                );
                assert_eq!(plan.gates, PoolGates::Reserve);
                // A failed forward gave the reservation back with its slot.
                assert_eq!(plan.retry_slot(), Gated);
                assert_eq!(in_order.retry_slot(), Gated);
            }
        }
    }

    #[test]
    fn token_rates_are_a_token_phase_only_on_a_serverless_model() {
        let plan_serverless = plan(
            Route::ChatCompletions,
            "sk-itpm",
            &entry(serverless(budget()), 1, None),
        );
        assert_eq!(
            visits(&plan_serverless),
            [Quota(Ahead), Slot(SlotAdmit::Ahead)]
        );
        assert_eq!(
            visits(&plan_serverless.in_order()),
            [Quota(Requests), Reserve, Tokens, Slot(Reserved)]
        );
        // On a reserved model the key's ITPM has nothing to check: the gates take the slot.
        let plan_reserved = plan(Route::ChatCompletions, "sk-itpm", &entry(budget(), 1, None));
        assert_eq!(visits(&plan_reserved), [Quota(Requests), Slot(Gated)]);
    }

    #[test]
    fn pool_gates_without_a_token_phase_take_the_slot_in_the_gates_visit() {
        let gated = entry(budget(), 1, None);
        for raw in ["sk-rpm", "sk-model-rpm"] {
            let plan = plan(Route::ChatCompletions, raw, &gated);
            assert_eq!(visits(&plan), [Quota(Requests), Slot(Gated)], "{raw}");
            assert_eq!(plan.retry_slot(), Gated);
        }
        // A key with no limit never visits its quota owner.
        let plan = plan(Route::ChatCompletions, "sk-none", &gated);
        assert!(!plan.limited);
        assert_eq!(visits(&plan), [Slot(Gated)]);
    }

    #[test]
    fn a_key_share_gates_a_serverless_budget_only() {
        let plan_serverless = plan(
            Route::ChatCompletions,
            "sk-share",
            &entry(serverless(budget()), 1, None),
        );
        assert_eq!(plan_serverless.share, 0.25);
        assert_eq!(visits(&plan_serverless), [Slot(Gated)]);
        // Reserved model: no B4, no share.
        let plan_reserved = plan(
            Route::ChatCompletions,
            "sk-share",
            &entry(budget(), 1, None),
        );
        assert_eq!(plan_reserved.share, 0.0);
        assert_eq!(visits(&plan_reserved), [Slot(Gated)]);
        // Serverless without an occupancy budget: a share of nothing, no gate.
        let plan_no_budget = plan(
            Route::ChatCompletions,
            "sk-share",
            &entry(serverless(inflight()), 1, None),
        );
        assert_eq!(plan_no_budget.share, 0.0);
    }

    #[test]
    fn request_caps_alone_split_the_quota_visits_without_a_reservation() {
        let capped = entry(caps(), 1, None);
        let plan_daily = plan(Route::ChatCompletions, "sk-daily", &capped);
        assert!(plan_daily.request_caps);
        assert_eq!(
            visits(&plan_daily),
            [Quota(Ahead), RequestCaps, Slot(Direct)]
        );
        assert_eq!(
            visits(&plan_daily.in_order()),
            [Quota(Requests), RequestCaps, Tokens, Slot(Direct)]
        );
        let plan_rpm = plan(Route::ChatCompletions, "sk-rpm", &capped);
        assert_eq!(
            visits(&plan_rpm),
            [Quota(Requests), RequestCaps, Slot(Direct)]
        );
        assert_eq!(plan_rpm.retry_slot(), Direct);
    }

    #[test]
    fn keys_without_limits_visit_only_the_model_owner() {
        let plan = plan(Route::ChatCompletions, "sk-none", &entry(open(), 1, None));
        assert_eq!(visits(&plan), [Slot(Direct)]);
        assert_eq!(plan.rate(), RequestsAndTokens);
        // The anonymous key of `api.mode: none` likewise.
        let open_registry = KeyRegistry::open();
        let anonymous = match open_registry.authenticate(None, NOW_MS) {
            AuthOutcome::Authenticated { key, .. } => key,
            _ => panic!("the open registry refuses no one"),
        };
        let plan = VisitPlan::of(
            Route::Messages,
            anonymous,
            &entry(budget(), 1, None),
            false,
            false,
        );
        assert_eq!(visits(&plan), [Slot(Gated)]);
    }

    #[test]
    fn routes_without_generation_charge_requests_only_and_pass_no_gate() {
        let gated = entry(serverless(caps_and_budget()), 1, None);
        for route in [Route::CountTokens, Route::Embeddings, Route::Rerank] {
            let plan = plan(route, "sk-daily", &gated);
            assert_eq!(visits(&plan), [Quota(Requests), Slot(Direct)], "{route:?}");
            assert!(!plan.generates && !plan.serverless && !plan.request_caps);
            assert_eq!(plan.share, 0.0);
        }
    }

    fn caps_and_budget() -> ModelPolicy {
        ModelPolicy {
            max_input_tokens: 4096,
            admit_budget_tokens: 100_000,
            ..open()
        }
    }

    #[test]
    fn hold_at_zero_waits_after_the_quota_and_reserves_when_released() {
        let asleep = |policy| entry(policy, 0, Some(120));
        let plan_open = plan(Route::ChatCompletions, "sk-daily", &asleep(open()));
        assert_eq!(plan_open.hold_budget, Some(Duration::from_secs(120)));
        assert_eq!(
            visits(&plan_open),
            [Quota(RequestsAndTokens), Hold, Slot(Direct)]
        );
        // Pool gates: a released request reserves first, even without a token phase.
        let plan_gated = plan(Route::ChatCompletions, "sk-rpm", &asleep(budget()));
        assert_eq!(
            visits(&plan_gated),
            [Quota(RequestsAndTokens), Hold, Reserve, Slot(Reserved)]
        );
        assert_eq!(plan_gated.retry_slot(), Gated);
        // The whole quota before the hold: the pool gates, after the release, split nothing.
        let plan_tokens = plan(Route::ChatCompletions, "sk-daily", &asleep(budget()));
        assert_eq!(
            visits(&plan_tokens),
            [Quota(RequestsAndTokens), Hold, Reserve, Slot(Reserved)]
        );
        let plan_itpm = plan(
            Route::ChatCompletions,
            "sk-itpm",
            &asleep(serverless(budget())),
        );
        assert_eq!(
            visits(&plan_itpm),
            [Quota(RequestsAndTokens), Hold, Reserve, Slot(Reserved)]
        );
        // B1 splits them: the token phase still comes before the hold.
        let plan_caps = plan(
            Route::ChatCompletions,
            "sk-daily",
            &asleep(caps_and_budget()),
        );
        assert_eq!(
            visits(&plan_caps),
            [
                Quota(Requests),
                RequestCaps,
                Tokens,
                Hold,
                Reserve,
                Slot(Reserved)
            ]
        );
        assert_eq!(plan_caps.tokens, TokenPhase::BeforeHold);
        // Embeddings are held too, and gate nothing.
        let plan_embed = plan(Route::Embeddings, "sk-none", &asleep(budget()));
        assert_eq!(visits(&plan_embed), [Hold, Slot(Direct)]);
    }

    #[test]
    fn a_placed_model_with_agents_and_count_tokens_are_never_held() {
        let awake = entry(budget(), 1, Some(120));
        let plan_awake = plan(Route::ChatCompletions, "sk-rpm", &awake);
        assert!(!plan_awake.holds());
        assert_eq!(visits(&plan_awake), [Quota(Requests), Slot(Gated)]);
        assert_eq!(
            hold_budget(Route::ChatCompletions, &awake),
            Some(Duration::from_secs(120))
        );
        let asleep = entry(budget(), 0, Some(120));
        assert_eq!(hold_budget(Route::CountTokens, &asleep), None);
        let plan_count = plan(Route::CountTokens, "sk-rpm", &asleep);
        assert!(!plan_count.holds());
        assert_eq!(visits(&plan_count), [Quota(Requests), Slot(Direct)]);
    }

    #[test]
    fn provider_fallback_only_for_non_streamed_generation_with_a_client() {
        let registry = registry();
        let key = key(&registry, "sk-rpm");
        let provided = entry(with_provider(open()), 1, None);
        let of = |route, stream, configured| {
            VisitPlan::of(route, key, &provided, stream, configured).provider_fallback
        };
        assert!(of(Route::ChatCompletions, false, true));
        assert!(of(Route::Messages, false, true));
        assert!(!of(Route::ChatCompletions, true, true));
        assert!(!of(Route::ChatCompletions, false, false));
        assert!(!of(Route::Embeddings, false, true));
        assert!(
            !VisitPlan::of(
                Route::ChatCompletions,
                key,
                &entry(open(), 1, None),
                false,
                true
            )
            .provider_fallback
        );
        // The fallback changes no visit before it.
        assert_eq!(
            visits(&VisitPlan::of(
                Route::ChatCompletions,
                key,
                &provided,
                false,
                true
            )),
            [Quota(RequestsAndTokens), Slot(Direct)]
        );
    }

    #[test]
    fn every_plan_keeps_the_module_invariants() {
        let registry = registry();
        let open_registry = KeyRegistry::open();
        let anonymous = match open_registry.authenticate(None, NOW_MS) {
            AuthOutcome::Authenticated { key, .. } => key,
            _ => panic!("the open registry refuses no one"),
        };
        let keys: Vec<&KeyRecord> = registry.iter().chain([anonymous]).collect();
        let policies = [
            open(),
            budget(),
            inflight(),
            caps(),
            caps_and_budget(),
            serverless(open()),
            serverless(budget()),
            serverless(caps_and_budget()),
        ];
        let routes = [
            Route::ChatCompletions,
            Route::Messages,
            Route::CountTokens,
            Route::Embeddings,
            Route::Rerank,
        ];
        for key in keys {
            for policy in &policies {
                for (agents, hold_secs) in [(1, None), (0, Some(60)), (2, Some(60))] {
                    let entry = entry(policy.clone(), agents, hold_secs);
                    for route in routes {
                        let plan = VisitPlan::of(route, key, &entry, false, false);
                        if plan.tokens == TokenPhase::Ahead {
                            // Charged ahead: no hold, and the rest in the gate order's way
                            // is a plan of its own, checked like the others below.
                            assert!(!plan.holds(), "{route:?} {}", key.name);
                            assert_eq!(plan.steps().next(), Some(Quota(Ahead)));
                            assert_ne!(plan.in_order().tokens, TokenPhase::Ahead);
                            // A bounced slot visit takes the gate order's way from the gates:
                            // the reservation, then the token phase, then the slot.
                            let mut place = Place::GATES;
                            let in_order = plan.in_order();
                            let from_gates: Vec<Step> =
                                std::iter::from_fn(|| in_order.next_step(&mut place)).collect();
                            if plan.gates == PoolGates::Reserve {
                                assert_eq!(from_gates, [Reserve, Tokens, Slot(Reserved)]);
                            }
                        }
                        for plan in [plan, plan.in_order()] {
                            let visits = visits(&plan);
                            let case = format!("{route:?} {} {policy:?} {agents}", key.name);
                            // The slot visit is last, and only there.
                            assert!(matches!(visits.last(), Some(Slot(_))), "{case}");
                            let slots = visits.iter().filter(|visit| matches!(visit, Slot(_)));
                            assert_eq!(slots.count(), 1, "{case}");
                            // A token visit follows a first quota visit that charged requests alone.
                            if visits.contains(&Tokens) {
                                assert_eq!(visits[0], Quota(Requests), "{case}");
                            }
                            // A reservation is brought by the slot visit.
                            assert_eq!(
                                visits.contains(&Reserve),
                                visits.last() == Some(&Slot(Reserved)),
                                "{case}"
                            );
                            // A held request's whole quota is checked before the hold.
                            if let Some(hold) = visits.iter().position(|visit| *visit == Hold) {
                                assert!(
                                    !visits[hold..].contains(&Tokens)
                                        && !visits[hold..].iter().any(|v| matches!(v, Quota(_))),
                                    "{case}"
                                );
                            }
                            // The token phase is charged in one visit, never in both.
                            assert!(
                                !(visits.contains(&Tokens)
                                    && (visits.contains(&Quota(RequestsAndTokens))
                                        || visits.contains(&Quota(Ahead)))),
                                "{case}"
                            );
                            // Gates after a charge ahead bounce rather than park.
                            assert_eq!(
                                visits.contains(&Slot(SlotAdmit::Ahead)),
                                plan.tokens == TokenPhase::Ahead && plan.gates != PoolGates::None,
                                "{case}"
                            );
                        }
                    }
                }
            }
        }
    }
}

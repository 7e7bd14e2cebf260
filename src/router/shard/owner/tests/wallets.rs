//! The owner with occupancy credits: routers sharing a model's budgets, a short wallet that
//! parks and asks, closed and forfeited wallets, and the per-key share between routers.

use super::*;

/// An owner whose models share their budgets with other routers, the store answering with
/// `routers` live.
fn sharing_owner(routers: u32) -> Owner {
    let mut owner = owner();
    owner.models.share_budgets(routers);
    owner.set_share(crate::logic::limits::Share::Shared {
        round: 1,
        live: routers,
        silent: 0,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    });
    owner
}

/// The sync core's answer to a refill: `granted` credits of `MODEL`'s `kind` budget, acknowledged.
fn grant_credits(
    owner: &mut Owner,
    at_ms: u64,
    kind: crate::logic::credits::BudgetKind,
    granted: u64,
    effects: &mut Effects,
) {
    owner.models.credit_news(
        Millis(at_ms),
        crate::router::shard::owner::wallets::CreditNews::Granted {
            model: MODEL,
            kind,
            granted,
            acknowledged: true,
        },
        effects,
    );
}

#[test]
fn a_short_wallet_parks_its_request_and_the_grant_admits_it() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = (sharing_owner(2), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let first = gated(1, 40, 100, Some(Millis(250)), true);
    assert_eq!(
        decision(owner.serve(&at(0), ticket(1), first, &mut effects)),
        None,
        "no credits yet: parked"
    );
    let refill = *effects
        .refills
        .iter()
        .find(|refill| refill.kind == BudgetKind::Tokens)
        .expect("a token refill");
    assert_eq!(
        refill.want,
        40 + 100 / 8,
        "the request and an eighth of the budget"
    );
    assert_eq!(refill.budget, 100);
    let requests = effects
        .refills
        .iter()
        .find(|refill| refill.kind == BudgetKind::Requests)
        .map(|refill| refill.want);
    effects.refills.clear();
    effects.parked = 0;
    // A second request while the refill is on its way asks for nothing more.
    let second = gated(2, 10, 100, Some(Millis(250)), true);
    assert_eq!(
        decision(owner.serve(&at(0), ticket(2), second, &mut effects)),
        None
    );
    assert!(effects.refills.is_empty());
    if let Some(want) = requests {
        grant_credits(&mut owner, 5, BudgetKind::Requests, want + 1, &mut effects);
    }
    grant_credits(&mut owner, 5, BudgetKind::Tokens, 52, &mut effects);
    let decisions = decided(&mut effects);
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert!(
        decisions
            .iter()
            .all(|(_, decision)| matches!(decision, Decision::Granted(_)))
    );
    assert_eq!(owner.models.credits(MODEL, BudgetKind::Tokens), Some(52));
    // A round keeps what is in use and the headroom; the store hears of it.
    let mut holds = Vec::new();
    let mut effects = Effects::default();
    owner
        .models
        .credit_round(Millis(1_000), true, &mut holds, &mut effects);
    let tokens = holds
        .iter()
        .find(|hold| hold.kind == BudgetKind::Tokens)
        .expect("the token budget's holding");
    assert_eq!(tokens.in_use, 50);
    assert_eq!(
        tokens.holding, 52,
        "50 in use and up to 12 of headroom, within the 52 held"
    );
    assert!(tokens.ran_short);
}

#[test]
fn a_router_closed_or_forfeited_admits_nothing_new() {
    use crate::logic::credits::BudgetKind;
    use crate::router::shard::owner::wallets::CreditNews;
    let (mut owner, mut effects) = (sharing_owner(1), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let grant = |owner: &mut Owner, effects: &mut Effects| {
        grant_credits(owner, 0, BudgetKind::Tokens, 100, effects);
    };
    // The model's wallets exist once a request asked.
    let _ = owner.serve(
        &at(0),
        ticket(1),
        gated(1, 10, 100, None, false),
        &mut effects,
    );
    grant(&mut owner, &mut effects);
    owner
        .models
        .credit_news(Millis(0), CreditNews::Closed(true), &mut effects);
    assert_eq!(
        decision(owner.serve(
            &at(1),
            ticket(2),
            gated(2, 10, 100, None, false),
            &mut effects
        )),
        Some(Decision::PoolFull)
    );
    owner
        .models
        .credit_news(Millis(0), CreditNews::Closed(false), &mut effects);
    assert_eq!(
        decision(owner.serve(
            &at(2),
            ticket(3),
            gated(3, 10, 100, None, false),
            &mut effects
        )),
        Some(Decision::Reserved)
    );
    owner
        .models
        .credit_news(Millis(0), CreditNews::Forfeit, &mut effects);
    assert_eq!(owner.models.credits(MODEL, BudgetKind::Tokens), Some(0));
    assert_eq!(
        decision(owner.serve(
            &at(3),
            ticket(4),
            gated(4, 10, 100, None, false),
            &mut effects
        )),
        Some(Decision::PoolFull)
    );
}

/// `MODEL`'s wallets hold its whole budget (100 tokens, 8 requests), and nothing is in use: a
/// request without a share parks for them, and ends once admitted.
fn fund(owner: &mut Owner, effects: &mut Effects) {
    use crate::logic::credits::BudgetKind;
    let visit = gated(99, 1, 100, Some(Millis(250)), false);
    assert_eq!(
        decision(owner.serve(&at(0), ticket(99), visit, effects)),
        None
    );
    grant_credits(owner, 0, BudgetKind::Tokens, 100, effects);
    grant_credits(owner, 0, BudgetKind::Requests, 8, effects);
    assert_eq!(decided(effects), [(99, Decision::Reserved)]);
    let release = Notice::ReleaseReservation {
        model: MODEL,
        ticket: ticket(99),
    };
    owner.notice(&at(0), release, effects);
    effects.refills.clear();
}

/// An owner sharing its budgets with another router, `MODEL` on one agent of capacity 8 and its
/// wallets funded ([`fund`]).
fn funded_owner() -> (Owner, Effects) {
    let (mut owner, mut effects) = (sharing_owner(2), Effects::default());
    up(&mut owner, 8, 1, &mut effects);
    fund(&mut owner, &mut effects);
    (owner, effects)
}

/// A request of `KeyId(1)`, whose B4 share is half of `MODEL`'s 100 tokens, needing `tokens`.
fn keyed(sequence: u64, tokens: u64, park_until: Option<Millis>) -> Visit {
    gated_with_share(sequence, tokens, 100, park_until, false, 0.5)
}

/// The key's B4 share (half of a 100-token budget) has a pool of its own: `KEY`'s requests wait
/// for credits for it like B2's, the whole share may go to the one router that serves the key,
/// and a request over the share is refused at once.
#[test]
fn a_keys_occupancy_share_is_exact_across_the_routers() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = funded_owner();
    let keyed = |sequence: u64, tokens: u64| keyed(sequence, tokens, Some(Millis(250)));
    let share = BudgetKind::Share(KeyId(1));
    assert_eq!(
        decision(owner.serve(&at(1), ticket(1), keyed(1, 30), &mut effects)),
        None,
        "within the share, short of credits for it: parked"
    );
    let asked: Vec<_> = effects
        .refills
        .iter()
        .filter(|refill| refill.kind == share)
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "one refill of the key's share: {:?}",
        effects.refills
    );
    assert_eq!((asked[0].want, asked[0].budget), (30 + 50 / 8, 50));
    effects.refills.clear();
    grant_credits(&mut owner, 2, share, 36, &mut effects);
    assert_eq!(decided(&mut effects), [(1, Decision::Reserved)]);
    // The other router holds nothing of the share: this one may take all of it, more than the
    // half an even split would give it.
    assert_eq!(
        decision(owner.serve(&at(3), ticket(2), keyed(2, 20), &mut effects)),
        None
    );
    let want = effects
        .refills
        .iter()
        .find(|refill| refill.kind == share)
        .unwrap()
        .want;
    assert_eq!(
        want,
        50 + 6 - 36,
        "in use, the request and the headroom, less what is held"
    );
    effects.refills.clear();
    grant_credits(&mut owner, 4, share, 14, &mut effects);
    assert_eq!(decided(&mut effects), [(2, Decision::Reserved)]);
    assert_eq!(owner.models.credits(MODEL, share), Some(50));
    assert_eq!(
        decision(owner.serve(&at(5), ticket(3), keyed(3, 1), &mut effects)),
        Some(Decision::KeyShare),
        "the whole share in use: refused at once, whatever the park timeout"
    );
    assert!(
        effects.refills.iter().all(|refill| refill.kind != share),
        "nothing asked of a share in use"
    );
}

/// The key's pool has nothing free (the other routers hold the rest of the share): the parked
/// request is refused at once, and so is the next one, without asking again until a round.
#[test]
fn a_share_the_site_uses_up_refuses_at_once() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = funded_owner();
    let keyed = |sequence: u64, tokens: u64| keyed(sequence, tokens, Some(Millis(250)));
    let share = BudgetKind::Share(KeyId(1));
    assert_eq!(
        decision(owner.serve(&at(1), ticket(1), keyed(1, 10), &mut effects)),
        None
    );
    effects.refills.clear();
    grant_credits(&mut owner, 2, share, 0, &mut effects);
    assert_eq!(decided(&mut effects), [(1, Decision::KeyShare)]);
    assert_eq!(
        decision(owner.serve(&at(3), ticket(2), keyed(2, 10), &mut effects)),
        Some(Decision::KeyShare)
    );
    assert!(effects.refills.iter().all(|refill| refill.kind != share));
    // A round: the others may have given some back, so the next request asks again.
    let mut holdings = Vec::new();
    owner
        .models
        .credit_round(Millis(1_000), true, &mut holdings, &mut effects);
    let later = self::keyed(3, 10, Some(Millis(1_250)));
    assert_eq!(
        decision(owner.serve(&at(1_001), ticket(3), later, &mut effects)),
        None
    );
    assert!(effects.refills.iter().any(|refill| refill.kind == share));
}

/// While the store is unreachable a router keeps to its part of the key's share (share ÷
/// routers), within the credits it holds; each round reports what it holds of the share, and a
/// key's wallet that holds nothing and went unused for a minute goes.
#[test]
fn a_keys_share_alone_and_its_rounds() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = funded_owner();
    let keyed = |sequence: u64, tokens: u64| keyed(sequence, tokens, None);
    let share = BudgetKind::Share(KeyId(1));
    assert_eq!(
        decision(owner.serve(&at(1), ticket(1), keyed(1, 10), &mut effects)),
        Some(Decision::KeyShare),
        "park timeout 0: refused, and the refill is asked for the next one"
    );
    grant_credits(&mut owner, 2, share, 40, &mut effects);
    owner.models.set_credit_cap(false, 2, 2);
    assert_eq!(
        decision(owner.serve(&at(3), ticket(2), keyed(2, 25), &mut effects)),
        Some(Decision::Reserved),
        "25 of the 50: this router's part"
    );
    assert_eq!(
        decision(owner.serve(&at(3), ticket(3), keyed(3, 1), &mut effects)),
        Some(Decision::KeyShare)
    );
    owner.models.set_credit_cap(true, 2, 2);
    let mut holdings = Vec::new();
    owner
        .models
        .credit_round(Millis(1_000), true, &mut holdings, &mut effects);
    let held = holdings
        .iter()
        .find(|holding| holding.kind == share)
        .expect("the share's holding");
    assert_eq!(
        (held.holding, held.in_use, held.budget),
        (25 + 50 / 8, 25, 50)
    );
    let release = Notice::ReleaseReservation {
        model: MODEL,
        ticket: ticket(2),
    };
    owner.notice(&at(1_500), release, &mut effects);
    holdings.clear();
    owner
        .models
        .credit_round(Millis(62_000), true, &mut holdings, &mut effects);
    let held = holdings
        .iter()
        .find(|holding| holding.kind == share)
        .expect("given back");
    assert_eq!(held.holding, 0, "idle for a minute: everything back");
    holdings.clear();
    owner
        .models
        .credit_round(Millis(63_000), true, &mut holdings, &mut effects);
    assert!(
        holdings.iter().all(|holding| holding.kind != share),
        "the wallet went"
    );
}

/// A burst that arrives while a refill is on its way: the grant covers the first requests, and
/// those still parked get a refill of their own at once (they would otherwise wait out their
/// park timeout, as nothing else asks for them).
#[test]
fn requests_still_parked_after_a_grant_get_a_refill_of_their_own() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = (sharing_owner(2), Effects::default());
    up(&mut owner, 8, 1, &mut effects);
    for sequence in 1..=3 {
        let visit = gated(sequence, 10, 100, Some(Millis(250)), true);
        let decided = decision(owner.serve(&at(0), ticket(sequence), visit, &mut effects));
        assert_eq!(decided, None, "request {sequence} parks");
    }
    let token_wants = |effects: &Effects| -> Vec<u64> {
        let refills = effects.refills.iter();
        refills
            .filter(|refill| refill.kind == BudgetKind::Tokens)
            .map(|refill| refill.want)
            .collect()
    };
    assert_eq!(
        token_wants(&effects),
        [10 + 100 / 8],
        "one refill on its way"
    );
    let requests = effects
        .refills
        .iter()
        .find(|refill| refill.kind == BudgetKind::Requests)
        .map(|refill| refill.want);
    effects.refills.clear();
    if let Some(want) = requests {
        grant_credits(&mut owner, 5, BudgetKind::Requests, want + 2, &mut effects);
    }
    effects.refills.clear();
    // 22 tokens: the first two fit, the third is still parked and asks for its part.
    grant_credits(&mut owner, 5, BudgetKind::Tokens, 22, &mut effects);
    assert_eq!(decided(&mut effects).len(), 2);
    assert_eq!(
        token_wants(&effects),
        [20 + 10 + 100 / 8 - 22],
        "in use, parked and the headroom, less what is held"
    );
    effects.refills.clear();
    grant_credits(&mut owner, 6, BudgetKind::Tokens, 20, &mut effects);
    assert_eq!(decided(&mut effects).len(), 1, "the third is admitted");
    assert!(
        token_wants(&effects).is_empty(),
        "nothing parked: nothing asked"
    );
}

/// A requester that charged its token phase first asks to be told where the request would
/// park: short of credits for the key's share, that is [`Decision::WouldPark`] (it gives the
/// charge back and parks), as for B2's credits; over the share it is the refusal.
#[test]
fn short_of_share_credits_is_a_park_for_a_requester_that_bounces() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = funded_owner();
    let bouncing = |sequence: u64, tokens: u64| {
        let mut visit = keyed(sequence, tokens, Some(Millis(250)));
        if let Visit::Acquire {
            pool: Some(request),
            ..
        } = &mut visit
        {
            request.bounce_park = true;
        }
        visit
    };
    assert_eq!(
        decision(owner.serve(&at(1), ticket(1), bouncing(1, 10), &mut effects)),
        Some(Decision::WouldPark)
    );
    assert!(
        effects
            .refills
            .iter()
            .any(|refill| refill.kind == BudgetKind::Share(KeyId(1))),
        "the key's share is asked for meanwhile"
    );
    assert_eq!(
        decision(owner.serve(&at(1), ticket(2), bouncing(2, 51), &mut effects)),
        Some(Decision::KeyShare)
    );
}

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

#[test]
fn a_keys_occupancy_share_is_split_between_the_routers() {
    use crate::logic::credits::BudgetKind;
    let (mut owner, mut effects) = (sharing_owner(2), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let keyed =
        |sequence: u64, tokens: u64| gated_with_share(sequence, tokens, 100, None, false, 0.5);
    let _ = owner.serve(&at(0), ticket(1), keyed(1, 1), &mut effects);
    grant_credits(&mut owner, 0, BudgetKind::Tokens, 100, &mut effects);
    // The key's share is 50 of 100 for the site: 25 on each of the two routers.
    assert_eq!(
        decision(owner.serve(&at(1), ticket(2), keyed(2, 25), &mut effects)),
        Some(Decision::Reserved)
    );
    assert_eq!(
        decision(owner.serve(&at(1), ticket(3), keyed(3, 1), &mut effects)),
        Some(Decision::KeyShare)
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

//! Occupancy admission's rules (budgets, parks, B4 shares), one test each.

use super::*;
use proptest::prelude::*;

fn ticket(sequence: u64) -> Ticket {
    Ticket { shard: 0, sequence }
}

fn claim(sequence: u64, input: u64, output: u64) -> Claim {
    Claim {
        ticket: ticket(sequence),
        footprint: Footprint {
            input_tokens: input,
            declared_output_tokens: output,
        },
        key: KeyId(1),
        share: 0.0,
    }
}

/// [`claim`] of a key with a B4 share (`max_occupancy_share`) of `share`, no declared output.
fn shared_claim(sequence: u64, input: u64, share: f64) -> Claim {
    Claim {
        share,
        ..claim(sequence, input, 0)
    }
}

const NOW: Millis = Millis(1_000);

#[test]
fn limits_scale_with_healthy_replicas_floored_at_one() {
    let limits = Limits::new(0.9, 1000, 4, 0);
    assert_eq!(limits.budget_tokens, 900);
    assert_eq!(limits.max_inflight, 4);
    assert_eq!(limits.share_base_tokens, 1000);
    let limits = Limits::new(0.9, 1000, 4, 3);
    assert_eq!(limits.budget_tokens, 2700);
    assert_eq!(limits.max_inflight, 12);
    assert_eq!(Limits::new(0.9, 0, 0, 3), Limits::default());
    // floor(0.9 × 1001) = 900.
    assert_eq!(Limits::new(0.9, 1001, 0, 1).budget_tokens, 900);
}

#[test]
fn budget_and_backstop_refuse_without_park() {
    let limits = Limits::new(1.0, 100, 2, 1);
    let mut pool = Occupancy::new(NOW);
    assert_eq!(
        pool.admit(NOW, &limits, claim(1, 60, 0), None, ALONE),
        Verdict::Admitted
    );
    assert_eq!(
        pool.admit(NOW, &limits, claim(2, 30, 20), None, ALONE),
        Verdict::Refused(Refusal::Budget)
    );
    assert_eq!(
        pool.admit(NOW, &limits, claim(3, 30, 10), None, ALONE),
        Verdict::Admitted
    );
    assert_eq!(pool.tokens(), 100);
    // Budget full and backstop at 2.
    assert_eq!(
        pool.admit(NOW, &limits, claim(4, 0, 0), None, ALONE),
        Verdict::Refused(Refusal::Budget)
    );
    assert_eq!(pool.release(NOW, ticket(1)), Some(KeyId(1)));
    assert_eq!(
        pool.release(NOW, ticket(1)),
        None,
        "a second release is a no-op"
    );
    assert_eq!(pool.tokens(), 40);
    assert_eq!(pool.inflight(), 1);
}

#[test]
fn parked_requests_are_admitted_in_order_when_room_frees() {
    let limits = Limits::new(1.0, 100, 0, 1);
    let mut pool = Occupancy::new(NOW);
    let until = Some(NOW.plus_ms(250));
    assert_eq!(
        pool.admit(NOW, &limits, claim(1, 90, 0), until, ALONE),
        Verdict::Admitted
    );
    assert_eq!(
        pool.admit(NOW, &limits, claim(2, 50, 0), until, ALONE),
        Verdict::Parked
    );
    // Fits on its own, but does not overtake request 2.
    assert_eq!(
        pool.admit(NOW, &limits, claim(3, 5, 0), until, ALONE),
        Verdict::Parked
    );
    assert!(pool.admit_parked(NOW, &limits, ALONE).is_empty());
    pool.release(NOW, ticket(1));
    assert_eq!(
        pool.admit_parked(NOW, &limits, ALONE),
        vec![(ticket(2), Ok(())), (ticket(3), Ok(()))]
    );
    assert_eq!(pool.tokens(), 55);
}

#[test]
fn park_deadline_expires_and_unblocks_those_behind() {
    let limits = Limits::new(1.0, 100, 0, 1);
    let mut pool = Occupancy::new(NOW);
    pool.admit(NOW, &limits, claim(1, 60, 0), None, ALONE);
    assert_eq!(
        pool.admit(NOW, &limits, claim(2, 50, 0), Some(NOW.plus_ms(100)), ALONE),
        Verdict::Parked
    );
    assert_eq!(
        pool.admit(NOW, &limits, claim(3, 10, 0), Some(NOW.plus_ms(500)), ALONE),
        Verdict::Parked
    );
    assert_eq!(pool.next_park_deadline(), Some(NOW.plus_ms(100)));
    assert!(
        pool.expire_parked(NOW.plus_ms(99), &limits, ALONE)
            .is_empty()
    );
    assert_eq!(
        pool.expire_parked(NOW.plus_ms(100), &limits, ALONE),
        vec![(ticket(2), Refusal::Budget)]
    );
    assert_eq!(
        pool.admit_parked(NOW.plus_ms(100), &limits, ALONE),
        vec![(ticket(3), Ok(()))]
    );
    // A deadline already past refuses instead of parking.
    assert_eq!(
        pool.admit(NOW, &limits, claim(4, 50, 0), Some(NOW), ALONE),
        Verdict::Refused(Refusal::Budget)
    );
}

/// With a site, the share is held to this router's credits for the key as well: short of
/// them a request parks (and blocks those behind it, as B2 does), once they come it is
/// admitted, and once the site's share is known to be in use it is refused; past its park
/// deadline it is refused by B4, not B2.
#[test]
fn a_share_short_of_credits_parks_until_they_come() {
    use std::cell::Cell;
    let limits = Limits::new(1.0, 1000, 0, 1);
    let mut pool = Occupancy::new(NOW);
    let shared = |sequence, input| shared_claim(sequence, input, 0.5);
    let credits = Cell::new(0);
    let spent = Cell::new(false);
    let cap = Cell::new(Cap::Credits);
    let lookup = |key: KeyId, limit: u64| {
        assert_eq!((key, limit), (KeyId(1), 500));
        Some(ShareCredits {
            allowance: Allowance {
                credits: credits.get(),
                cap: cap.get(),
            },
            spent: spent.get(),
        })
    };
    let until = Some(NOW.plus_ms(100));
    assert_eq!(
        pool.admit(NOW, &limits, shared(1, 200), until, &lookup),
        Verdict::Parked
    );
    assert_eq!(
        pool.head_short_of_share(&limits, &lookup),
        Some((KeyId(1), 0.5, 200))
    );
    let unkeyed = claim(2, 10, 0);
    assert_eq!(
        pool.admit(NOW, &limits, unkeyed, until, &lookup),
        Verdict::Parked,
        "nobody overtakes it"
    );
    credits.set(300);
    let admitted = pool.admit_parked(NOW, &limits, &lookup);
    assert_eq!(admitted, vec![(ticket(1), Ok(())), (ticket(2), Ok(()))]);
    assert_eq!(pool.key_tokens(KeyId(1)), 200);
    // 200 + 150 > 300 held: short again; the pool then says it has nothing free.
    assert_eq!(
        pool.admit(NOW, &limits, shared(3, 150), until, &lookup),
        Verdict::Parked
    );
    spent.set(true);
    assert_eq!(
        pool.admit_parked(NOW, &limits, &lookup),
        vec![(ticket(3), Err(Refusal::KeyShare))]
    );
    assert_eq!(
        pool.admit(NOW, &limits, shared(4, 150), until, &lookup),
        Verdict::Refused(Refusal::KeyShare)
    );
    // The store does not answer: this router's part of the share (250), nothing to wait for.
    spent.set(false);
    cap.set(Cap::Share { share: 250 });
    assert_eq!(
        pool.admit(NOW, &limits, shared(5, 60), until, &lookup),
        Verdict::Refused(Refusal::KeyShare)
    );
    assert_eq!(
        pool.admit(NOW, &limits, shared(6, 50), until, &lookup),
        Verdict::Admitted
    );
    // Short of credits at the deadline: B4's refusal.
    cap.set(Cap::Credits);
    assert_eq!(
        pool.admit(NOW, &limits, shared(7, 100), until, &lookup),
        Verdict::Parked
    );
    assert_eq!(
        pool.expire_parked(NOW.plus_ms(100), &limits, &lookup),
        vec![(ticket(7), Refusal::KeyShare)]
    );
}

#[test]
fn key_share_refuses_at_once_and_ignores_the_admit_fraction() {
    // Budget 0.5 × 1000 = 500; share 0.25 × 1000 = 250 (no fraction).
    let limits = Limits::new(0.5, 1000, 0, 1);
    let mut pool = Occupancy::new(NOW);
    let shared = |sequence, input| shared_claim(sequence, input, 0.25);
    assert_eq!(
        pool.admit(NOW, &limits, shared(1, 200), None, ALONE),
        Verdict::Admitted
    );
    assert_eq!(
        pool.admit(NOW, &limits, shared(2, 51), Some(NOW.plus_ms(100)), ALONE),
        Verdict::Refused(Refusal::KeyShare)
    );
    assert_eq!(
        pool.admit(NOW, &limits, shared(3, 50), None, ALONE),
        Verdict::Admitted
    );
    // Another key is not affected by key 1's share.
    let other = Claim {
        key: KeyId(2),
        ..shared(4, 251)
    };
    assert_eq!(
        pool.admit(NOW, &limits, other, None, ALONE),
        Verdict::Refused(Refusal::Budget)
    );
    assert_eq!(
        pool.tokens(),
        250,
        "a refusal leaves occupancy where it was"
    );
}

#[test]
fn growth_and_true_up_move_the_totals() {
    let limits = Limits::new(1.0, 1000, 0, 1);
    let mut pool = Occupancy::new(NOW);
    pool.admit(NOW, &limits, claim(1, 100, 0), None, ALONE);
    pool.grow(NOW, ticket(1), 30);
    assert_eq!(pool.tokens(), 130);
    pool.grow(NOW, ticket(1), 20);
    assert_eq!(pool.tokens(), 130, "growth never shrinks");
    pool.true_up(NOW, ticket(1), 80);
    assert_eq!(pool.tokens(), 110);
    pool.admit(NOW, &limits, claim(2, 10, 50), None, ALONE);
    pool.grow(NOW, ticket(2), 20);
    assert_eq!(pool.tokens(), 170, "declared output already covers 20");
    pool.release(NOW, ticket(1));
    pool.release(NOW, ticket(2));
    assert_eq!(pool.tokens(), 0);
}

#[test]
fn reaper_releases_only_stale_reservations() {
    let limits = Limits::default();
    let mut pool = Occupancy::new(NOW);
    pool.admit(NOW, &limits, claim(1, 10, 0), None, ALONE);
    pool.admit(NOW.plus_ms(500), &limits, claim(2, 10, 0), None, ALONE);
    assert_eq!(pool.reap(NOW.plus_ms(1000), 1000), 1);
    assert!(pool.holds(ticket(2)));
    assert_eq!(pool.tokens(), 10);
}

/// A reservation whose release is lost (the owner never hears of the request again) is the
/// one thing the reaper exists for. No production path loses a release, so the leak is made
/// here, in the pure pool the shard drives: it is reaped once, counted once, gives its tokens
/// and its share back, while a live stream beside it that keeps growing is never reaped; a
/// release that turns up after the reaper is a no-op.
#[test]
fn a_leaked_reservation_is_reaped_and_counted_once() {
    const REAP_AFTER_MS: u64 = 2_000;
    let limits = Limits::new(1.0, 1000, 2, 1);
    let mut occupancy = Occupancy::new(NOW);
    let keyed = |sequence, input| shared_claim(sequence, input, 0.5);
    assert_eq!(
        occupancy.admit(NOW, &limits, keyed(1, 100), None, ALONE),
        Verdict::Admitted
    );
    assert_eq!(
        occupancy.admit(NOW, &limits, keyed(2, 50), None, ALONE),
        Verdict::Admitted
    );
    assert_eq!(occupancy.inflight(), 2);
    // Ticket 1 leaks; ticket 2 streams on, growing its reservation every 16 events (here
    // every second), so it is never untouched for as long as REAP_AFTER_MS.
    let mut reaped = 0;
    for second in 1..=5 {
        let now = NOW.plus_ms(second * 1000);
        occupancy.grow(now, ticket(2), second * 16);
        reaped += occupancy.reap(now, REAP_AFTER_MS);
    }
    assert_eq!(reaped, 1, "the leak is reaped exactly once");
    assert!(!occupancy.holds(ticket(1)));
    assert!(
        occupancy.holds(ticket(2)),
        "a live stream must not be reaped"
    );
    assert_eq!(occupancy.inflight(), 1);
    assert_eq!(occupancy.tokens(), 50 + 5 * 16);
    assert_eq!(occupancy.by_key.get(&KeyId(1)), Some(&(50 + 5 * 16)));
    // The lost release arrives after all: nothing is taken from ticket 2.
    assert_eq!(occupancy.release(NOW.plus_ms(6000), ticket(1)), None);
    assert_eq!(occupancy.tokens(), 50 + 5 * 16);
    assert!(occupancy.release(NOW.plus_ms(6000), ticket(2)).is_some());
    assert_eq!((occupancy.tokens(), occupancy.inflight()), (0, 0));
    assert!(occupancy.by_key.is_empty());
    assert_eq!(occupancy.reap(NOW.plus_ms(60_000), REAP_AFTER_MS), 0);
}

#[test]
fn idle_after_fifteen_minutes_without_work() {
    let mut pool = Occupancy::new(NOW);
    pool.admit(NOW, &Limits::default(), claim(1, 10, 0), None, ALONE);
    assert!(!pool.is_idle(NOW.plus_ms(IDLE_DROP_MS * 2)));
    pool.release(NOW.plus_ms(10), ticket(1));
    assert!(!pool.is_idle(NOW.plus_ms(IDLE_DROP_MS)));
    assert!(pool.is_idle(NOW.plus_ms(10 + IDLE_DROP_MS)));
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        input: u64,
        output: u64,
        key: u32,
        share: bool,
        park: bool,
    },
    Grow {
        which: usize,
        output: u64,
    },
    TrueUp {
        which: usize,
        input: u64,
    },
    Release {
        which: usize,
    },
    Cancel {
        which: usize,
    },
    Expire {
        after_ms: u64,
    },
    Reap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..400, 0u64..200, 1u32..4, any::<bool>(), any::<bool>()).prop_map(
            |(input, output, key, share, park)| Op::Admit {
                input,
                output,
                key,
                share,
                park
            }
        ),
        (0usize..64, 0u64..300).prop_map(|(which, output)| Op::Grow { which, output }),
        (0usize..64, 0u64..400).prop_map(|(which, input)| Op::TrueUp { which, input }),
        (0usize..64).prop_map(|which| Op::Release { which }),
        (0usize..64).prop_map(|which| Op::Cancel { which }),
        (0u64..300).prop_map(|after_ms| Op::Expire { after_ms }),
        Just(Op::Reap),
    ]
}

proptest! {
    /// Any interleaving of admit / park / growth / true-up / release / cancel / expiry /
    /// reaping leaves the pool at zero once every request is over, and the totals always
    /// equal the sums over what is held.
    #[test]
    fn idle_pool_returns_to_zero(ops in proptest::collection::vec(op(), 1..200)) {
        let limits = Limits::new(0.9, 1000, 5, 1);
        let mut pool = Occupancy::new(Millis(0));
        let mut now = Millis(0);
        let mut issued: Vec<Ticket> = Vec::new();
        for (sequence, op) in ops.into_iter().enumerate() {
            match op {
                Op::Admit { input, output, key, share, park } => {
                    let ticket = ticket(sequence as u64);
                    let claim = Claim {
                        ticket,
                        footprint: Footprint { input_tokens: input, declared_output_tokens: output },
                        key: KeyId(key),
                        share: if share { 0.4 } else { 0.0 },
                    };
                    let park_until = park.then(|| now.plus_ms(100));
                    pool.admit(now, &limits, claim, park_until, ALONE);
                    issued.push(ticket);
                }
                Op::Grow { which, output } => {
                    if let Some(ticket) = issued.get(which) {
                        pool.grow(now, *ticket, output);
                    }
                }
                Op::TrueUp { which, input } => {
                    if let Some(ticket) = issued.get(which) {
                        pool.true_up(now, *ticket, input);
                    }
                }
                Op::Release { which } => {
                    if let Some(ticket) = issued.get(which) {
                        pool.release(now, *ticket);
                        pool.admit_parked(now, &limits, ALONE);
                    }
                }
                Op::Cancel { which } => {
                    if let Some(ticket) = issued.get(which) {
                        pool.cancel_parked(*ticket);
                        pool.release(now, *ticket);
                        pool.admit_parked(now, &limits, ALONE);
                    }
                }
                Op::Expire { after_ms } => {
                    now = now.plus_ms(after_ms);
                    pool.expire_parked(now, &limits, ALONE);
                    pool.admit_parked(now, &limits, ALONE);
                }
                Op::Reap => {
                    pool.reap(now, 250);
                }
            }
            let held_sum: u64 = pool.held.values().map(Held::tokens).sum();
            prop_assert_eq!(pool.tokens, held_sum);
            for (key, tokens) in &pool.by_key {
                let sum: u64 = pool.held.values().filter(|held| held.keyed && held.key == *key).map(Held::tokens).sum();
                prop_assert_eq!(*tokens, sum);
                prop_assert!(*tokens > 0);
            }
        }
        for ticket in &issued {
            pool.cancel_parked(*ticket);
            pool.release(now, *ticket);
        }
        prop_assert_eq!(pool.tokens(), 0);
        prop_assert_eq!(pool.inflight(), 0);
        prop_assert!(pool.by_key.is_empty());
        prop_assert_eq!(pool.parked_len(), 0);
    }
}

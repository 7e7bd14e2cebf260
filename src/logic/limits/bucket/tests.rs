//! The token bucket's rules, one test each (`sync::simulation` seeds named where one found a
//! defect).

use super::*;
use proptest::prelude::*;

fn at(seconds: u64) -> Millis {
    Millis::from_seconds(seconds)
}

#[test]
fn starts_full_and_refuses_exactly_past_capacity() {
    let mut bucket = Bucket::new(at(0), 60, 60);
    for _ in 0..60 {
        bucket.try_take(at(0), 1).unwrap();
    }
    let shortfall = bucket.try_take(at(0), 1).unwrap_err();
    assert_eq!(shortfall.limit, 60);
    assert_eq!(shortfall.remaining, 0);
    // 60 per minute: one per second.
    assert_eq!(shortfall.reset_seconds, Some(1));
}

#[test]
fn refills_continuously_not_at_the_minute() {
    let mut bucket = Bucket::new(at(0), 60, 60);
    bucket.try_take(at(0), 60).unwrap();
    assert!(bucket.try_take(Millis(999), 1).is_err());
    bucket.try_take(Millis(1000), 1).unwrap();
    assert!(bucket.try_take(Millis(1000), 1).is_err());
}

#[test]
fn full_again_after_exactly_sixty_seconds() {
    let mut bucket = Bucket::new(at(0), 100, 100);
    bucket.try_take(at(0), 100).unwrap();
    assert!(!bucket.is_full(Millis(59_999)));
    assert_eq!(bucket.remaining(Millis(59_999)), 99);
    assert!(bucket.is_full(at(60)));
    bucket.try_take(at(60), 100).unwrap();
}

#[test]
fn refused_take_changes_nothing() {
    let mut bucket = Bucket::new(at(0), 10, 10);
    bucket.try_take(at(0), 4).unwrap();
    assert!(bucket.try_take(at(0), 7).is_err());
    assert_eq!(bucket.remaining(at(0)), 6);
    assert_eq!(bucket.take_delta(), 4);
}

#[test]
fn more_than_capacity_never_fits() {
    let mut bucket = Bucket::new(at(0), 10, 10);
    assert_eq!(bucket.try_take(at(0), 11).unwrap_err().reset_seconds, None);
}

#[test]
fn charge_is_clamped_to_one_capacity_and_locks_out_at_most_a_minute() {
    let mut bucket = Bucket::new(at(0), 600, 600);
    assert_eq!(bucket.charge(at(0), 1_000_000), 600);
    assert_eq!(bucket.charge(at(0), 1_000_000), 600);
    // Two huge responses: the floor is minus one capacity, so back to full two minutes later
    // and not drained after one minute.
    assert!(bucket.check_not_drained(Millis(59_999)).is_err());
    bucket.check_not_drained(Millis(60_100)).unwrap();
    assert!(bucket.is_full(at(120)));
}

#[test]
fn refund_restores_level_and_delta() {
    let mut bucket = Bucket::new(at(0), 100, 100);
    bucket.try_take(at(0), 30).unwrap();
    bucket.refund(30);
    assert!(bucket.is_full(at(0)));
    assert_eq!(bucket.take_delta(), 0);
    // A refund after the round took the delta offsets the next round.
    bucket.try_take(at(0), 30).unwrap();
    assert_eq!(bucket.take_delta(), 30);
    bucket.refund(30);
    bucket.try_take(at(0), 50).unwrap();
    assert_eq!(bucket.take_delta(), 20);
}

#[test]
fn local_plus_remote_usage_respects_the_limit() {
    // Two routers share a 100/min limit; each applies the other's delta every second.
    let mut router_a = Bucket::new(at(0), 100, 100);
    let mut router_b = Bucket::new(at(0), 100, 100);
    let mut admitted = 0u64;
    for second in 0..=120u64 {
        let now = at(second);
        for _ in 0..10 {
            admitted += router_a.try_take(now, 1).is_ok() as u64;
            admitted += router_b.try_take(now, 1).is_ok() as u64;
        }
        let delta_a = router_a.take_delta();
        let delta_b = router_b.take_delta();
        router_a.apply_remote(now, delta_b, 0, Share::Whole);
        router_b.apply_remote(now, delta_a, 0, Share::Whole);
    }
    // Allowed over 120 s: one burst plus the refill, plus what one round can overshoot (each
    // router spends the same last-known level once before it hears of the other).
    let allowed = 100 + 100 * 120 / 60;
    assert!(admitted <= allowed + 100, "admitted {admitted}");
    // And well above a single router's share: both were used.
    assert!(admitted >= allowed - 10, "admitted {admitted}");
}

/// Below half its capacity a bucket asks to be anchored; the anchor sets the site's level
/// less what was admitted here since the round took its usage; a view built from merged
/// usage is not settled until anchored.
#[test]
fn an_anchor_sets_the_sites_level_less_what_was_admitted_since() {
    let mut bucket = Bucket::new(at(0), 60, 60);
    assert_eq!(bucket.anchor_view(at(0)), None, "full: nothing to ask");
    bucket.try_take(at(0), 40).unwrap();
    let view = bucket.anchor_view(at(0)).expect("below half");
    assert_eq!(view.level_units, 20 * UNITS_PER_TOKEN);
    assert!(view.settled);
    assert_eq!(bucket.take_delta(), 40);
    // Admitted after the round took its usage: not in the store's level yet.
    bucket.try_take(at(0), 3).unwrap();
    bucket.anchor(at(0), 5 * UNITS_PER_TOKEN, Share::Whole, false);
    assert_eq!(bucket.remaining(at(0)), 2);
    assert_eq!(
        bucket.take_delta(),
        3,
        "the anchor publishes nothing itself"
    );
    bucket.unsettle();
    assert!(!bucket.anchor_view(at(0)).expect("low").settled);
    bucket.anchor(at(0), 0, Share::Whole, false);
    assert!(bucket.anchor_view(at(0)).expect("low").settled);
}

/// With a silent router, the site's level only lowers a view: the store refills it at the
/// whole rate, the silent router's part included (`perf/site-chaos.sh`, store-cut-kill).
#[test]
fn with_a_silent_router_the_sites_level_only_lowers_the_view() {
    let silent = Share::Shared {
        round: 7,
        live: 2,
        silent: 1,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    let mut bucket = Bucket::new(at(0), 60, 60);
    bucket.try_take(at(0), 60).unwrap();
    assert_eq!(bucket.take_delta(), 60);
    // 30 s later: the store's level refilled 30, the live routers' part of it 20.
    bucket.anchor(at(30), 30 * UNITS_PER_TOKEN, silent, false);
    assert_eq!(bucket.remaining(at(30)), 20);
    bucket.anchor(at(30), 5 * UNITS_PER_TOKEN, silent, false);
    assert_eq!(bucket.remaining(at(30)), 5, "a lower level lowers the view");
    // With every router live, the site's level is the view, up or down.
    let everyone = Share::Shared {
        round: 8,
        live: 3,
        silent: 0,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    bucket.anchor(at(30), 30 * UNITS_PER_TOKEN, everyone, false);
    assert_eq!(bucket.remaining(at(30)), 30);
}

/// For a few rounds after a failover the site's level only lowers a view: the promoted
/// replica's levels may miss decrements it had not received (`sync::simulation`, seed 1,329).
#[test]
fn after_a_failover_the_sites_level_only_lowers_the_view() {
    let mut bucket = Bucket::new(at(0), 60, 60);
    bucket.try_take(at(0), 50).unwrap();
    assert_eq!(bucket.take_delta(), 50);
    bucket.anchor(at(0), 30 * UNITS_PER_TOKEN, Share::Whole, true);
    assert_eq!(
        bucket.remaining(at(0)),
        10,
        "a stale high level does not raise it"
    );
    bucket.anchor(at(0), 4 * UNITS_PER_TOKEN, Share::Whole, true);
    assert_eq!(bucket.remaining(at(0)), 4, "a lower level lowers it");
    bucket.anchor(at(0), 30 * UNITS_PER_TOKEN, Share::Whole, false);
    assert_eq!(bucket.remaining(at(0)), 30, "then, up or down");
}

#[test]
fn remote_usage_drains_local_bucket() {
    let mut bucket = Bucket::new(at(0), 60, 60);
    bucket.apply_remote(at(0), 60, 0, Share::Whole);
    assert!(bucket.try_take(at(0), 1).is_err());
    assert_eq!(bucket.take_delta(), 0);
    bucket.try_take(at(1), 1).unwrap();
}

/// After a store outage: this router's first round saw the two others' stale heartbeats.
const TWO_SILENT: Share = Share::Shared {
    round: 1,
    live: 1,
    silent: 2,
    late: 0,
    at_least: 0,
    unlisted: 0,
    unread: 0,
    away_since: None,
};
const THREE_LIVE: Share = Share::Shared {
    round: 2,
    live: 3,
    silent: 0,
    late: 0,
    at_least: 0,
    unlisted: 0,
    unread: 0,
    away_since: None,
};

#[test]
fn with_silent_routers_the_live_one_uses_its_part_however_the_level_drops() {
    let mut bucket = Bucket::new(at(0), 30, 30);
    let admitted = (0..30)
        .filter(|_| bucket.try_take_shared(at(0), 1, TWO_SILENT).is_ok())
        .count();
    assert_eq!(admitted, 10);
    // It refills its part of the rate: one request every six seconds.
    assert!(bucket.try_take_shared(at(5), 1, TWO_SILENT).is_err());
    bucket.try_take_shared(at(6), 1, TWO_SILENT).unwrap();
    assert!(bucket.try_take_shared(at(6), 1, TWO_SILENT).is_err());
}

#[test]
fn usage_applied_while_routers_were_silent_is_charged_once_when_they_are_live() {
    // Regression (tests/shared_limits.rs, store_stopped_each_router_enforces_its_share): a key
    // used only on router A during a store outage showed 1 request left on router B instead
    // of 21. B applied A's 8 in its first round after the outage, which still saw A and C as
    // silent, and the bucket cut to a third stayed cut once they were live again.
    let mut bucket = Bucket::new(at(0), 30, 30);
    bucket.apply_remote(at(0), 8, 0, TWO_SILENT);
    assert_eq!(bucket.remaining(at(0)), 2, "a third, less the usage");
    bucket.try_take_shared(at(0), 1, THREE_LIVE).unwrap();
    assert_eq!(bucket.remaining(at(0)), 21);
}

#[test]
fn a_scale_that_shrinks_again_holds_back_again() {
    let mut bucket = Bucket::new(at(0), 30, 30);
    bucket.try_take_shared(at(0), 3, TWO_SILENT).unwrap();
    bucket.try_take_shared(at(0), 3, Share::Whole).unwrap();
    assert_eq!(bucket.remaining(at(0)), 24);
    let admitted = (0..30)
        .filter(|_| bucket.try_take_shared(at(0), 1, TWO_SILENT).is_ok())
        .count();
    assert_eq!(admitted, 10);
    bucket.try_take_shared(at(0), 1, Share::Whole).unwrap();
    assert_eq!(bucket.remaining(at(0)), 13);
}

/// Seed 400 of `sync::simulation`: router-1 had both others silent, their parts held back,
/// its view 135 requests; then the store stopped answering. Alone, the held parts came back
/// and a third of the whole view was its allowance: 246 requests where its part was 135,
/// while the two others, cut off, spent theirs. Alone, the silent routers keep their part.
#[test]
fn alone_after_silent_routers_their_parts_stay_held() {
    let mut bucket = Bucket::new(at(0), 30, 30);
    bucket.try_take_shared(at(0), 4, TWO_SILENT).unwrap();
    assert_eq!(bucket.remaining(at(0)), 6);
    let alone = Share::Alone {
        since: 1,
        routers: 3,
        late: 0,
        unread: 0,
    };
    let admitted = (0..30)
        .filter(|_| bucket.try_take_shared(at(0), 1, alone).is_ok())
        .count();
    assert_eq!(
        admitted, 6,
        "its part, the 10 of 30 it had, less the 4 it took"
    );
    // Back with the store and every router live, the held parts are the key's again.
    bucket.try_take_shared(at(0), 1, THREE_LIVE).unwrap();
    assert_eq!(bucket.remaining(at(0)), 19);
}

#[test]
fn time_going_backwards_refills_nothing() {
    let mut bucket = Bucket::new(at(10), 60, 60);
    bucket.try_take(at(10), 60).unwrap();
    assert!(bucket.try_take(at(5), 1).is_err());
    bucket.try_take(at(11), 1).unwrap();
}

#[test]
fn rescaling_keeps_a_full_bucket_full_and_a_used_one_used() {
    let mut bucket = Bucket::new(at(0), 10, 10);
    bucket.set_rate(at(0), 30, 30);
    assert_eq!(bucket.remaining(at(0)), 30);
    bucket.try_take(at(0), 25).unwrap();
    bucket.set_rate(at(0), 10, 10);
    assert_eq!(bucket.remaining(at(0)), 5);
    bucket.set_rate(at(0), 30, 30);
    assert_eq!(bucket.remaining(at(0)), 5);
}

#[test]
fn inherit_keeps_usage_under_a_new_limit() {
    let mut previous = Bucket::new(at(0), 100, 100);
    previous.try_take(at(0), 40).unwrap();
    let mut raised = Bucket::new(at(0), 200, 200);
    raised.inherit(at(0), &previous);
    assert_eq!(raised.remaining(at(0)), 160);
    assert_eq!(raised.take_delta(), 40);
    let mut lowered = Bucket::new(at(0), 30, 30);
    lowered.inherit(at(0), &previous);
    assert_eq!(lowered.remaining(at(0)), 0);
    assert!(lowered.try_take(at(0), 1).is_err());
}

/// A minute of a saturated site's usage, replayed at once on a bucket that took one request
/// of its own first, leaves it where the site's bucket is (seeds 255 and 390).
#[test]
fn a_replay_of_a_saturated_minute_leaves_the_sites_level() {
    // 1,200 a minute: the burst at 0, then the rate, 10 every 500 ms, until 60 s.
    let mut history = vec![(at(0), 1_200)];
    history.extend((1..=120).map(|half_seconds| (Millis(half_seconds * 500), 10)));
    let mut site = Bucket::new(at(0), 1_200, 1_200);
    for &(admitted, amount) in &history {
        site.apply_remote(admitted, amount, 0, Share::Whole);
    }
    let mut started = Bucket::new(at(61), 1_200, 1_200);
    started.try_take(at(61), 1).unwrap();
    started.replay(at(61), &history, Share::Whole);
    assert_eq!(started.level(at(61)), site.level(at(61)) - 1);
    assert!(site.level(at(61)).abs() <= 40, "{}", site.level(at(61)));
}

proptest! {
    /// A new bucket that replays a history ends where a bucket that lived it is.
    #[test]
    fn a_replay_is_the_history_lived(
        rate in 1u64..10_000,
        steps in proptest::collection::vec((0u64..5_000, 1u64..5_000), 1..100),
        after_ms in 0u64..120_000,
    ) {
        let mut lived = Bucket::new(Millis(0), rate, rate);
        let mut now = 0;
        let mut history = Vec::new();
        for (advance_ms, amount) in steps {
            now += advance_ms;
            lived.apply_remote(Millis(now), amount, 0, Share::Whole);
            history.push((Millis(now), amount));
        }
        let end = Millis(now + after_ms);
        let mut replayed = Bucket::new(end, rate, rate);
        replayed.replay(end, &history, Share::Whole);
        prop_assert_eq!(replayed.level_at(end), lived.level_at(end));
    }

    /// Over any sequence of takes at non-decreasing times, what was admitted never exceeds
    /// the capacity plus the refill over the elapsed time.
    #[test]
    fn admitted_never_exceeds_burst_plus_refill(
        rate in 1u64..10_000,
        capacity in 1u64..10_000,
        steps in proptest::collection::vec((0u64..5_000, 1u64..50), 1..200),
    ) {
        let mut bucket = Bucket::new(Millis(0), rate, capacity);
        let mut now = 0u64;
        let mut admitted = 0u64;
        for (advance_ms, amount) in steps {
            now += advance_ms;
            if bucket.try_take(Millis(now), amount).is_ok() {
                admitted += amount;
            }
            let bound_units = capacity as u128 * UNITS_PER_TOKEN as u128
                + now as u128 * rate as u128;
            prop_assert!(admitted as u128 * UNITS_PER_TOKEN as u128 <= bound_units);
        }
        prop_assert_eq!(bucket.take_delta(), admitted);
    }

    /// A take refused at one moment succeeds once `reset_seconds` have passed.
    #[test]
    fn reset_seconds_is_enough(
        rate in 1u64..10_000,
        capacity in 1u64..10_000,
        used in 0u64..10_000,
        amount in 1u64..10_000,
    ) {
        let mut bucket = Bucket::new(Millis(0), rate, capacity);
        bucket.charge(Millis(0), used);
        if let Err(shortfall) = bucket.try_take(Millis(0), amount) {
            if let Some(seconds) = shortfall.reset_seconds {
                prop_assert!(bucket.try_take(Millis::from_seconds(seconds as u64), amount).is_ok());
            } else {
                prop_assert!(amount > capacity);
            }
        }
    }
}

/// Issue 33, sustained load: three routers share a key of 1,200 requests a minute, each offered
/// 500 a second, each running its sync round every 200 ms at its own phase and subtracting the
/// others' usage of their last round (published at their round, applied at its own). Over 20 s
/// after the burst is spent the site admits about what the rate allows, and no router is
/// starved. Before, the others' usage was credited with what the bucket "refilled since"
/// although the bucket had refilled meanwhile anyway: 1.2 to 3 times the rate got through.
#[test]
fn three_routers_under_sustained_load_admit_the_rate_between_them() {
    const RATE: u64 = 1200;
    const ROUTERS: usize = 3;
    const ROUND_MS: u64 = 200;
    const FROM_MS: u64 = 5_000;
    const UNTIL_MS: u64 = 25_000;
    let mut buckets: Vec<Bucket> = (0..ROUTERS)
        .map(|_| Bucket::new(Millis(0), RATE, RATE))
        .collect();
    let mut rounds = [0u32; ROUTERS];
    // Usage published: (publisher, admitted at, amount); each router reads what is new.
    let mut published: Vec<(usize, u64, u64)> = Vec::new();
    let mut read = [0usize; ROUTERS];
    let mut admitted = [0u64; ROUTERS];
    for now in 0..UNTIL_MS {
        for router in 0..ROUTERS {
            if (now + router as u64 * 67).is_multiple_of(ROUND_MS) {
                rounds[router] += 1;
                let delta = buckets[router].take_delta();
                published.push((router, now, delta));
                let share = Share::Shared {
                    round: rounds[router],
                    live: ROUTERS as u32,
                    silent: 0,
                    late: 0,
                    at_least: 0,
                    unlisted: 0,
                    unread: 0,
                    away_since: None,
                };
                for &(publisher, at, amount) in &published[read[router]..] {
                    if publisher != router {
                        buckets[router].apply_remote(Millis(now), amount, now - at, share);
                    }
                }
                read[router] = published.len();
            }
            if now.is_multiple_of(2) {
                let share = Share::Shared {
                    round: rounds[router],
                    live: ROUTERS as u32,
                    silent: 0,
                    late: 0,
                    at_least: 0,
                    unlisted: 0,
                    unread: 0,
                    away_since: None,
                };
                if buckets[router]
                    .try_take_shared(Millis(now), 1, share)
                    .is_ok()
                    && now >= FROM_MS
                {
                    admitted[router] += 1;
                }
            }
        }
    }
    let allowed = RATE * (UNTIL_MS - FROM_MS) / 60_000;
    let total: u64 = admitted.iter().sum();
    eprintln!("admitted {total} ({admitted:?}); the rate allows {allowed}");
    // The seed's excess: within one round's shares (each router's first request of a round).
    let rounds_in_window = (UNTIL_MS - FROM_MS) / ROUND_MS;
    assert!(
        total <= allowed + rounds_in_window,
        "admitted {total} ({admitted:?}) where the rate allows {allowed}"
    );
    for (router, count) in admitted.iter().enumerate() {
        assert!(
            *count >= allowed / ROUTERS as u64 / 2,
            "router {router} admitted {count} of {total} ({admitted:?}): starved"
        );
    }
}

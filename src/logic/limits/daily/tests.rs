//! The daily budget's rules, one test each, and the seeds of the site's simulation that found
//! a defect in them.

use super::*;

/// `router::sync::simulation` seed 8: the store restarted without its data and a router
/// read the totals again; they said less than it knew, and its budget reopened.
#[test]
fn a_smaller_total_read_from_the_store_lowers_nothing() {
    let mut budget = DailyBudget::new(MONDAY, 1_000);
    budget.admit(MONDAY, 100, None, Share::Whole).expect("fits");
    budget.set_others_total(MONDAY, 600);
    assert_eq!(budget.used(MONDAY), 700);
    // The store lost its data: the others' totals read again are smaller.
    budget.set_others_total(MONDAY, 50);
    assert_eq!(budget.used(MONDAY), 700);
    // A larger read (usage published meanwhile) counts.
    budget.set_others_total(MONDAY, 650);
    assert_eq!(budget.used(MONDAY), 750);
}
use proptest::prelude::*;

const MONDAY: Day = Day(20_000);
const TUESDAY: Day = Day(20_001);

/// The store answers: `live` routers (this one included), `silent` and `late` ones.
fn shared(round: u32, live: u32, silent: u32, late: u32) -> Share {
    Share::Shared {
        round,
        live,
        silent,
        late,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    }
}

/// Issue 33, the daily budget with the store down: three routers, 900 tokens a day, 102 spent
/// before the outage. Cut off, one router admits requests of 14 input and 20 output tokens
/// until refused: what it spends stays within its third of the 798 left (and one request's
/// output past it). Before, only the input estimates counted against its third: it spent
/// all 798.
#[test]
fn cut_off_a_router_spends_its_part_of_what_was_left_output_included() {
    let mut budget = DailyBudget::new(MONDAY, 900);
    let seen = Share::Shared {
        round: 39,
        live: 3,
        silent: 0,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    let before = budget.admit(MONDAY, 102, None, seen).unwrap();
    budget.settle(MONDAY, before, 102, 0, false);
    let alone = Share::Alone {
        since: 40,
        routers: 3,
        late: 0,
        unread: 0,
    };
    let mut spent = 0;
    while let Ok(admission) = budget.admit(MONDAY, 14, None, alone) {
        let settled = budget.settle(MONDAY, admission, 14, 20, false);
        spent += 14 + settled.output_tokens_charged;
        assert!(spent < 798, "spent everything left");
    }
    let part = (900 - 102) / 3;
    assert!(spent >= part - 34, "spent {spent}, its part is {part}");
    assert!(spent <= part + 20, "spent {spent}, its part is {part}");
    // A new round of a shared store starts a new allowance from what is left.
    let shared = Share::Shared {
        round: 41,
        live: 3,
        silent: 0,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    assert!(budget.admit(MONDAY, 14, None, shared).is_ok());
}

/// Seed 354 of `sync::simulation`: the store answered too late for a while, each of three
/// routers spent its third of the 9,000 left alone, and two of them went silent during it
/// (one crashed, one shut down before its last round could publish). Back with the store,
/// this router left the silent ones their part of what it believed was left, after its own
/// third: 4,000 of 6,000, where each had spent up to 3,000 unseen. It now leaves them their
/// part of what was left when the outage began.
#[test]
fn routers_silent_after_an_outage_keep_what_they_could_spend_in_it() {
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    let everyone = |round| shared(round, 3, 0, 0);
    assert!(budget.admit(MONDAY, 0, None, everyone(49)).is_ok());
    budget.apply_remote(MONDAY, 91_000);
    let alone = Share::Alone {
        since: 50,
        routers: 3,
        late: 0,
        unread: 0,
    };
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, alone).is_ok() {
        spent += 100;
    }
    assert_eq!(spent, 3_000, "its third of the 9,000 left");
    let back = Share::Shared {
        round: 51,
        live: 1,
        silent: 2,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    // 6,000 left as it knows; the silent two may have spent all of it.
    assert!(budget.admit(MONDAY, 100, None, back).is_err());
    // They come back and publish what they spent: 2,000 of their 6,000 were left.
    budget.apply_remote(MONDAY, 4_000);
    assert!(budget.admit(MONDAY, 100, None, everyone(52)).is_ok());
}

/// Seed 979 of `sync::simulation`: router-1 wrote its last record at round 7, with 30,000
/// left, and spends its part of that alone; the others can tell only at round 10, when they
/// have spent 9,000 more. Its part is of the 30,000, not of the 21,000.
#[test]
fn a_router_that_shows_silent_late_keeps_its_part_of_what_was_left_at_its_last_record() {
    let live = |round| shared(round, 3, 0, 0);
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 70_000);
    assert!(budget.admit(MONDAY, 0, None, live(7)).is_ok());
    for round in 8..10 {
        budget.apply_remote(MONDAY, 4_500);
        assert!(budget.admit(MONDAY, 0, None, live(round)).is_ok());
    }
    let silent = Share::Shared {
        round: 10,
        live: 2,
        silent: 1,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, silent).is_ok() {
        spent += 100;
    }
    // 21,000 left, 10,000 of it router-1's; the round's part of the rest is half.
    assert_eq!(spent, (21_000 - 10_000) / 2);
    // Past the seven rounds, a new silence is reckoned from later rounds.
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 70_000);
    assert!(budget.admit(MONDAY, 0, None, live(7)).is_ok());
    budget.apply_remote(MONDAY, 9_000);
    assert!(budget.admit(MONDAY, 0, None, live(14)).is_ok());
    let silent = Share::Shared {
        round: 15,
        live: 2,
        silent: 1,
        late: 0,
        at_least: 0,
        unlisted: 0,
        unread: 0,
        away_since: None,
    };
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, silent).is_ok() {
        spent += 100;
    }
    assert_eq!(spent, (21_000 - 7_000) / 2);
}

/// Seed 760 of `sync::simulation`: both other routers show silent with 12,000 left, a part
/// of 4,000 each that the 3,000 left now cannot hold; one comes back. The one still silent
/// keeps its whole part, not half of what was held back for both.
#[test]
fn a_silent_router_keeps_its_whole_part_when_another_comes_back() {
    let shared = |round, live, silent| shared(round, live, silent, 0);
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 88_000);
    assert!(budget.admit(MONDAY, 0, None, shared(7, 3, 0)).is_ok());
    budget.apply_remote(MONDAY, 9_000);
    assert!(budget.admit(MONDAY, 100, None, shared(8, 1, 2)).is_err());
    // Router-2 is back, its usage counted: 2,000 left, 4,000 of it still router-1's.
    budget.apply_remote(MONDAY, 1_000);
    assert!(budget.admit(MONDAY, 100, None, shared(9, 2, 1)).is_err());
    // Past what router-1 may spend, the rest is the live routers'.
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 70_000);
    assert!(budget.admit(MONDAY, 0, None, shared(7, 3, 0)).is_ok());
    budget.apply_remote(MONDAY, 9_000);
    assert!(budget.admit(MONDAY, 0, None, shared(8, 1, 2)).is_ok());
    // 21,000 left less router-1's 10,000; the round's part is half.
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, shared(9, 2, 1)).is_ok() {
        spent += 100;
    }
    assert_eq!(spent, (21_000 - 10_000) / 2);
}

/// Seed 37 of `sync::simulation`: router-2 went silent with about 36,000 tokens left, the
/// others stopped admitting at once (the reserve was a third of the whole 135,486), then
/// the store went down and router-1 alone split what it believed was left, router-2's
/// unseen usage included, by three: 8,276 tokens where its part was 4,367.
#[test]
fn silent_routers_keep_their_part_of_what_was_left_when_they_went_silent() {
    let silent = |round| shared(round, 2, 1, 0);
    let shared = |round| shared(round, 3, 0, 0);
    let mut budget = DailyBudget::new(MONDAY, 135_000);
    // A run's first rounds see every record fresh: they witness nothing.
    assert!(budget.admit(MONDAY, 0, None, shared(1)).is_ok());
    budget.apply_remote(MONDAY, 99_000);
    assert!(budget.admit(MONDAY, 100, None, shared(1)).is_ok());
    assert!(budget.admit(MONDAY, 100, None, silent(2)).is_err());
    let mut budget = DailyBudget::new(MONDAY, 135_000);
    budget.apply_remote(MONDAY, 99_000);
    assert!(budget.admit(MONDAY, 0, None, shared(9)).is_ok());
    // 36,000 left: 12,000 of it is the silent router's; the live ones use the rest.
    let mut spent = 0;
    for round in 10..30 {
        while budget.admit(MONDAY, 100, None, silent(round)).is_ok() {
            spent += 100;
        }
    }
    assert!(
        (23_900..=24_000).contains(&spent),
        "the live routers may use 24,000 of the 36,000 left, this one spent {spent}"
    );
    assert!(
        budget.admit(MONDAY, 100, None, silent(30)).is_err(),
        "the reserve does not shrink as the live routers spend"
    );
    // The store goes down: alone, this router splits what is left less the reserve.
    let mut budget = DailyBudget::new(MONDAY, 135_000);
    budget.apply_remote(MONDAY, 99_000);
    assert!(budget.admit(MONDAY, 0, None, shared(9)).is_ok());
    assert!(budget.admit(MONDAY, 100, None, silent(10)).is_ok());
    let alone = Share::Alone {
        since: 11,
        routers: 3,
        late: 0,
        unread: 0,
    };
    let mut alone_spent = 0;
    while budget.admit(MONDAY, 100, None, alone).is_ok() {
        alone_spent += 100;
    }
    let part = (36_000 - 100 - 12_000) / 3;
    assert!(
        alone_spent <= part + 100 && alone_spent + 100 >= part,
        "alone it spent {alone_spent}, its part is {part}"
    );
    // The silent router comes back and its usage is counted: nothing is left to it.
    budget.apply_remote(MONDAY, 5_000);
    let back = shared(12);
    let left = budget.remaining(MONDAY);
    let mut shared_spent = 0;
    while budget.admit(MONDAY, 100, None, back).is_ok() {
        shared_spent += 100;
    }
    assert!(
        shared_spent + 100 >= left / 3,
        "back to three live routers, the round's part is a third of the {left} left: {shared_spent}"
    );
    // A budget that did not see the router go silent (its router started since) cannot
    // tell what was left then: it leaves the silent router its part of the whole budget.
    let mut budget = DailyBudget::new(MONDAY, 135_000);
    budget.apply_remote(MONDAY, 99_000);
    assert!(budget.admit(MONDAY, 100, None, silent(10)).is_err());
    let mut budget = DailyBudget::new(MONDAY, 135_000);
    budget.apply_remote(MONDAY, 50_000);
    let mut unwitnessed = 0;
    while budget.admit(MONDAY, 100, None, silent(10)).is_ok() {
        unwitnessed += 100;
    }
    // 85,000 left less a third of the whole 135,000, split between the two live routers.
    let part = (85_000 - 45_000) / 2;
    assert!(
        (part - 100..=part).contains(&unwitnessed),
        "the round's part is {part}, this router spent {unwitnessed}"
    );
}

#[test]
fn worst_case_must_fit_but_only_input_is_charged() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    let admission = budget.admit(MONDAY, 300, Some(700), Share::Whole).unwrap();
    assert_eq!(admission.input_tokens, 300);
    assert_eq!(budget.remaining(MONDAY), 700);
    let refused = budget
        .admit(MONDAY, 300, Some(500), Share::Whole)
        .unwrap_err();
    assert_eq!(refused.remaining, 700);
    assert!(refused.because_of_max_output);
    let refused = budget.admit(MONDAY, 800, None, Share::Whole).unwrap_err();
    assert!(!refused.because_of_max_output);
}

#[test]
fn exactly_at_the_limit_and_spent() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    budget.admit(MONDAY, 600, Some(400), Share::Whole).unwrap();
    budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
    assert_eq!(budget.remaining(MONDAY), 0);
    let refused = budget.admit(MONDAY, 0, None, Share::Whole).unwrap_err();
    assert_eq!((refused.limit, refused.remaining), (1000, 0));
}

#[test]
fn true_up_adds_or_refunds_and_output_is_deducted() {
    let mut budget = DailyBudget::new(MONDAY, 10_000);
    let admission = budget.admit(MONDAY, 500, None, Share::Whole).unwrap();
    let settled = budget.settle(MONDAY, admission, 450, 200, false);
    assert_eq!(budget.used(MONDAY), 650);
    assert_eq!(settled.remaining, 9_350);
    let admission = budget.admit(MONDAY, 500, None, Share::Whole).unwrap();
    budget.settle(MONDAY, admission, 700, 0, false);
    assert_eq!(budget.used(MONDAY), 1_350);
}

#[test]
fn buffered_output_that_does_not_fit_is_refused_not_charged() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    let admission = budget.admit(MONDAY, 900, None, Share::Whole).unwrap();
    let settled = budget.settle(MONDAY, admission, 900, 200, true);
    assert!(!settled.output_fit);
    assert_eq!(settled.output_tokens_charged, 0);
    assert_eq!(settled.remaining, 0);
    // The prompt deduction remains.
    assert_eq!(budget.used(MONDAY), 900);
}

#[test]
fn streamed_output_past_the_budget_is_still_charged() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    let admission = budget.admit(MONDAY, 900, None, Share::Whole).unwrap();
    let settled = budget.settle(MONDAY, admission, 900, 200, false);
    assert!(!settled.output_fit);
    assert_eq!(settled.output_tokens_charged, 200);
    assert_eq!(budget.used(MONDAY), 1100);
    assert_eq!(budget.remaining(MONDAY), 0);
    assert!(budget.admit(MONDAY, 1, None, Share::Whole).is_err());
}

#[test]
fn resets_at_utc_midnight() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    budget.admit(MONDAY, 1000, None, Share::Whole).unwrap();
    assert!(budget.admit(MONDAY, 1, None, Share::Whole).is_err());
    assert!(!budget.is_idle(MONDAY));
    assert!(budget.is_idle(TUESDAY));
    assert_eq!(budget.remaining(TUESDAY), 1000);
    budget.admit(TUESDAY, 1000, None, Share::Whole).unwrap();
    // A clock stepping back does not reopen Monday.
    assert!(budget.admit(MONDAY, 1, None, Share::Whole).is_err());
}

#[test]
fn admitted_before_midnight_settled_after() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    let admission = budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
    // Settles on Tuesday: Monday's input correction is dropped with Monday's total, the
    // output is charged to Tuesday, when it was delivered.
    let settled = budget.settle(TUESDAY, admission, 10, 300, false);
    assert!(settled.output_fit);
    assert_eq!(budget.used(TUESDAY), 300);
    assert_eq!(budget.local_total(), (TUESDAY, 300));
    // A refund of Monday's charge does not give Tuesday free tokens.
    budget.refund(admission);
    assert_eq!(budget.used(TUESDAY), 300);
}

#[test]
fn refund_returns_the_input_charge() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    let admission = budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
    budget.refund(admission);
    assert_eq!(budget.used(MONDAY), 0);
    assert_eq!(budget.take_delta(), (MONDAY, 0));
}

#[test]
fn local_plus_remote_usage_respects_the_budget() {
    let mut router_a = DailyBudget::new(MONDAY, 1000);
    let mut router_b = DailyBudget::new(MONDAY, 1000);
    let mut admitted = 0;
    for _round in 0..100 {
        for _ in 0..3 {
            admitted += router_a
                .admit(MONDAY, 10, None, Share::Whole)
                .map_or(0, |a| a.input_tokens);
            admitted += router_b
                .admit(MONDAY, 10, None, Share::Whole)
                .map_or(0, |a| a.input_tokens);
        }
        let (day_a, delta_a) = router_a.take_delta();
        let (day_b, delta_b) = router_b.take_delta();
        router_a.apply_remote(day_b, delta_b);
        router_b.apply_remote(day_a, delta_a);
    }
    // Over by at most what both routers admitted in one round before hearing of each other
    // (seed `run-several-routers.md`: "within one sync interval of usage").
    assert!((1000..=1060).contains(&admitted), "admitted {admitted}");
    assert_eq!(router_a.remaining(MONDAY), 0);
    assert_eq!(router_b.remaining(MONDAY), 0);
    // Yesterday's remote usage is ignored once the day has moved on.
    router_a.apply_remote(TUESDAY, 5);
    router_a.apply_remote(MONDAY, 500);
    assert_eq!(router_a.used(TUESDAY), 5);
}

#[test]
fn changed_total_is_handed_out_once_per_change() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    assert_eq!(budget.take_changed_total(), None, "nothing charged yet");
    let admission = budget.admit(MONDAY, 300, None, Share::Whole).unwrap();
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 300)));
    assert_eq!(budget.take_changed_total(), None);
    budget.settle(MONDAY, admission, 250, 100, false);
    // The sync delta is independent of what was reported to disk.
    assert_eq!(budget.take_delta(), (MONDAY, 350));
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 350)));
    // A refund back to zero is a change too: the disk must not keep the old total.
    let admission = budget.admit(MONDAY, 50, None, Share::Whole).unwrap();
    budget.refund(admission);
    assert_eq!(
        budget.take_changed_total(),
        None,
        "back where it was reported"
    );
    let mut refunded = DailyBudget::new(MONDAY, 1000);
    let admission = refunded.admit(MONDAY, 50, None, Share::Whole).unwrap();
    assert_eq!(refunded.take_changed_total(), Some((MONDAY, 50)));
    refunded.refund(admission);
    assert_eq!(refunded.take_changed_total(), Some((MONDAY, 0)));
}

/// Long-mode seed 57,964: router-0 refunded 3 tokens net while alone, after publishing their
/// charge, then wrote its total whole after the store lost its data. The total stays at what
/// was published until the next usage offsets the refund, in the total as in the usage.
#[test]
fn a_net_refund_stays_in_the_total_until_later_usage_offsets_it() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    let admission = budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
    assert_eq!(budget.take_delta(), (MONDAY, 100));
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 100)));
    budget.settle(MONDAY, admission, 90, 0, false);
    assert_eq!(
        budget.take_delta(),
        (MONDAY, 0),
        "a net refund is not published"
    );
    assert_eq!(
        budget.take_changed_total(),
        None,
        "nor does it lower the total"
    );
    assert_eq!(budget.local_total(), (MONDAY, 100));
    assert_eq!(
        budget.used(MONDAY),
        90,
        "it is given back to this router's budget"
    );
    budget.admit(MONDAY, 30, None, Share::Whole).unwrap();
    assert_eq!(budget.take_delta(), (MONDAY, 20));
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 120)));
}

#[test]
fn changed_total_across_midnight() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 400)));
    budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
    // Midnight passes before Monday's last change was handed out: Tuesday has nothing to
    // write until it is charged (Monday's final total is no longer needed by anyone).
    assert_eq!(budget.remaining(TUESDAY), 1000);
    budget.admit(TUESDAY, 0, None, Share::Whole).unwrap();
    assert_eq!(budget.take_changed_total(), None);
    budget.admit(TUESDAY, 70, None, Share::Whole).unwrap();
    assert_eq!(budget.take_changed_total(), Some((TUESDAY, 70)));
    assert_eq!(budget.take_changed_total(), None);
}

#[test]
fn restore_counts_against_today_without_a_sync_delta() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    budget.restore(MONDAY, 600);
    assert_eq!(budget.used(MONDAY), 600);
    assert_eq!(budget.remaining(MONDAY), 400);
    assert_eq!(budget.local_total(), (MONDAY, 600));
    assert_eq!(
        budget.take_delta(),
        (MONDAY, 0),
        "published before the restart"
    );
    assert_eq!(
        budget.take_changed_total(),
        None,
        "the disk holds it already"
    );
    budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 700)));
    assert_eq!(budget.take_delta(), (MONDAY, 100));
    let refused = budget.admit(MONDAY, 301, None, Share::Whole).unwrap_err();
    assert_eq!(refused.remaining, 300);
}

#[test]
fn restore_for_a_past_day_is_ignored() {
    let mut budget = DailyBudget::new(TUESDAY, 1000);
    budget.restore(MONDAY, 600);
    assert_eq!(budget.used(TUESDAY), 0);
    assert_eq!(budget.take_changed_total(), None);
    // A total for a later day starts that day.
    let mut budget = DailyBudget::new(MONDAY, 1000);
    budget.admit(MONDAY, 10, None, Share::Whole).unwrap();
    budget.restore(TUESDAY, 600);
    assert_eq!(budget.used(TUESDAY), 600);
    assert_eq!(budget.take_changed_total(), None);
}

#[test]
fn reload_keeps_what_was_reported() {
    let mut budget = DailyBudget::new(MONDAY, 1000);
    budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
    assert_eq!(budget.take_changed_total(), Some((MONDAY, 100)));
    let mut reloaded = DailyBudget::new(MONDAY, 2000);
    reloaded.inherit(&budget);
    assert_eq!(reloaded.take_changed_total(), None);
}

proptest! {
    /// Within one day, the total after every request has settled equals exact usage.
    #[test]
    fn totals_after_settle_equal_exact_usage(
        requests in proptest::collection::vec(
            (0u64..5_000, 0u64..5_000, 0u64..5_000, proptest::option::of(0u64..5_000)),
            1..100,
        ),
    ) {
        let mut budget = DailyBudget::new(MONDAY, LIMIT_MAX);
        let mut exact_total = 0u64;
        for (estimate, exact_input, exact_output, max_output) in requests {
            let admission = budget.admit(MONDAY, estimate, max_output, Share::Whole).unwrap();
            budget.settle(MONDAY, admission, exact_input, exact_output, false);
            exact_total += exact_input + exact_output;
        }
        prop_assert_eq!(budget.used(MONDAY), exact_total);
        prop_assert_eq!(budget.take_delta(), (MONDAY, exact_total));
    }

    /// Admission never lets today's charged input pass the budget.
    #[test]
    fn admitted_input_never_exceeds_budget(
        limit in 1u64..100_000,
        estimates in proptest::collection::vec(0u64..10_000, 1..100),
    ) {
        let mut budget = DailyBudget::new(MONDAY, limit);
        for estimate in estimates {
            let _ = budget.admit(MONDAY, estimate, None, Share::Whole);
            prop_assert!(budget.used(MONDAY) <= limit);
        }
    }
}

/// Seed 710 of `sync::simulation`: router-1's new run reached the store twice, taking both
/// other routers for live (a record is live for its first three intervals under a new run's
/// eyes), where each had been alone for seconds. Then the store stopped answering, and it split
/// what it believed was left, their unseen usage included. A run that cannot tell a silent
/// router yet leaves each other router its part of the whole budget when alone; one that
/// could tell splits what was left.
#[test]
fn alone_before_a_new_run_could_tell_a_silent_router_it_leaves_the_others_their_part() {
    let shared = |round| shared(round, 3, 0, 0);
    let alone = |since| Share::Alone {
        since,
        routers: 3,
        late: 0,
        unread: 0,
    };
    let spent_alone = |rounds: u32| {
        let mut budget = DailyBudget::new(MONDAY, 90_000);
        budget.apply_remote(MONDAY, 30_000);
        for round in 1..=rounds {
            assert!(budget.admit(MONDAY, 0, None, shared(round)).is_ok());
        }
        let mut spent = 0;
        while budget.admit(MONDAY, 100, None, alone(rounds)).is_ok() {
            spent += 100;
        }
        spent
    };
    // 60,000 left as it believes, of which the others may hold 60,000 unseen.
    assert_eq!(spent_alone(2), 0);
    assert_eq!(spent_alone(SILENCE_SHOWS_FROM_ROUND - 1), 0);
    // From the round a silent router shows in, its view can be split: a third of 60,000.
    assert_eq!(spent_alone(SILENCE_SHOWS_FROM_ROUND), 20_000);
    // The run tells, not the budget: a key used once at round 2, next when the store stopped
    // answering at round 9, splits its third (`tests/shared_limits.rs`,
    // `cut_off_a_router_spends_its_third_of_the_daily_budget_left`: 88 tokens of its 289).
    let mut budget = DailyBudget::new(MONDAY, 90_000);
    budget.apply_remote(MONDAY, 30_000);
    assert!(budget.admit(MONDAY, 0, None, shared(2)).is_ok());
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, alone(9)).is_ok() {
        spent += 100;
    }
    assert_eq!(spent, 20_000);
}

/// Seed 1,629 of `sync::simulation`: router-2 was cut off just after its record at round 7
/// and spends its part of the 30,000 left alone. The others count it live for three more
/// intervals; each round they split what they believe is left, its usage not in it. Late from
/// its first missed heartbeat, it keeps its part of what was left at its record, and the two
/// others spend the rest, once: the site's day stays within its budget.
#[test]
fn a_late_router_keeps_its_part_from_its_first_missed_heartbeat() {
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 70_000);
    assert!(budget.admit(MONDAY, 0, None, shared(7, 3, 0, 0)).is_ok());
    let mut spent = 0;
    for round in 8..12 {
        while budget
            .admit(MONDAY, 100, None, shared(round, 3, 0, 1))
            .is_ok()
        {
            spent += 100;
        }
        // The other live router spent as much as this one in the round.
        budget.apply_remote(MONDAY, if round == 8 { spent } else { 0 });
    }
    // Router-2's 10,000 are left to it; this router and the other split the 20,000 left.
    assert_eq!(spent, 10_000);
    assert_eq!(budget.remaining(MONDAY), 10_000);
}

/// Through an outage, the late routers held back are those of the last round the store
/// answered, not of this budget's last admission: router-2, late at the round of the key's one
/// request and on time at every round after, had published what it spent by the outage, and
/// its part held back from that old round cost router-0 a third of its own
/// (`tests/shared_limits.rs`: 187 tokens spent of 289). Late at the outage's last round, its part
/// of what was left is held back.
#[test]
fn in_an_outage_the_late_routers_are_those_of_the_last_round() {
    let spent_alone = |late_at_outage| {
        let mut budget = DailyBudget::new(MONDAY, 90_000);
        for round in 1..=7 {
            assert!(
                budget
                    .admit(MONDAY, 0, None, shared(round, 3, 0, 0))
                    .is_ok()
            );
        }
        // The key's last request here, at a round with router-2 late.
        let admission = budget.admit(MONDAY, 300, None, shared(8, 3, 0, 1)).unwrap();
        budget.settle(MONDAY, admission, 300, 0, false);
        // The outage starts at round 30; the key's next request comes in it.
        let alone = Share::Alone {
            since: 30,
            routers: 3,
            late: late_at_outage,
            unread: 0,
        };
        let mut spent = 0;
        while budget.admit(MONDAY, 100, None, alone).is_ok() {
            spent += 100;
        }
        spent
    };
    // Its third of the 89,700 left.
    assert_eq!(spent_alone(0), 29_900);
    // Router-2's part of the most left over the recent rounds (90,000 before the request) held
    // back, this router's third of the rest.
    assert_eq!(spent_alone(1), 19_900);
}

/// A router late for a round, on time the next, takes nothing from a silent router's part:
/// folded into the silent routers' parts, its own (of what was left lately, less) came off
/// with a share of the older silent router's part when it was back on time.
#[test]
fn a_router_late_for_a_round_takes_nothing_from_a_silent_routers_part() {
    let share = shared;
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 40_000);
    for round in 1..=7 {
        assert!(budget.admit(MONDAY, 0, None, share(round, 3, 0, 0)).is_ok());
    }
    // Router-0 shows silent with 60,000 left: its part is 20,000.
    for round in 8..=14 {
        assert!(budget.admit(MONDAY, 0, None, share(round, 2, 1, 0)).is_ok());
        budget.apply_remote(MONDAY, 4_000);
    }
    // 32,000 left; router-2 is late for a round (its part of what was left lately held back
    // too: nothing is left to this router), then on time again.
    assert!(budget.admit(MONDAY, 0, None, share(15, 2, 1, 1)).is_err());
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, share(16, 2, 1, 0)).is_ok() {
        spent += 100;
    }
    // The 12,000 beside router-0's 20,000, split between the two routers on time.
    assert_eq!(spent, 6_000);
}

/// Seed 5,793 of `sync::simulation`: the store lost its data while router-1 was cut off from
/// it; router-0's new run, started since, lists two routers of a site of three and took the
/// store's totals, router-1's not in them, for the site's, while router-1 spent its part alone.
/// A router the site counts (`--sync-min-routers`) and the store does not list is left its part
/// of the whole budget, as a silent router the run did not see go silent.
#[test]
fn a_router_the_store_does_not_list_keeps_its_part_of_the_whole_budget() {
    let spent_over_rounds = |unlisted| {
        let mut budget = DailyBudget::new(MONDAY, 90_000);
        budget.apply_remote(MONDAY, 30_000);
        let mut spent = 0;
        for round in 1..=20 {
            let share = Share::Shared {
                round,
                live: 2,
                silent: 0,
                late: 0,
                at_least: 3,
                unlisted,
                unread: 0,
                away_since: None,
            };
            while budget.admit(MONDAY, 100, None, share).is_ok() {
                spent += 100;
            }
        }
        spent
    };
    // 60,000 left as it believes, 30,000 of it the unlisted router's third of the budget.
    assert_eq!(spent_over_rounds(1), 30_000);
    assert_eq!(spent_over_rounds(0), 60_000);
}

/// Router-1 wrote its last record between this router's rounds 6 and 7, the view it spends its
/// part of read after this router published at round 6 (30,000 left then), or, the reply of
/// that round lost, the round before, after round 5 (33,000 left then). Round 7, the first that
/// read the record, had 24,000 left, after this router and the other used 6,000. It shows
/// silent at round 11 and keeps its part of the 33,000, the most it may have seen.
#[test]
fn a_silent_routers_part_is_of_what_was_left_before_the_round_that_read_its_last_record() {
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 67_000);
    assert!(budget.admit(MONDAY, 0, None, shared(5, 3, 0, 0)).is_ok());
    budget.apply_remote(MONDAY, 3_000);
    assert!(budget.admit(MONDAY, 0, None, shared(6, 3, 0, 0)).is_ok());
    assert!(
        budget
            .admit(MONDAY, 3_000, None, shared(6, 3, 0, 0))
            .is_ok()
    );
    budget.apply_remote(MONDAY, 3_000);
    for round in 7..=10 {
        assert!(
            budget
                .admit(MONDAY, 0, None, shared(round, 3, 0, 0))
                .is_ok()
        );
    }
    let mut spent = 0;
    while budget.admit(MONDAY, 100, None, shared(11, 2, 1, 0)).is_ok() {
        spent += 100;
    }
    // 24,000 left less router-1's 11,000; the round's part is half.
    assert_eq!(spent, (24_000 - 11_000) / 2);
}

/// Seed 3,590 of `sync::simulation`: router-0 showed silent with about 49,700 left (a part of
/// 16,575); after a store outage router-2 showed silent too, with 15,557 left (a part of
/// 5,186), and came back. Router-0's part stays whole: the reserve loses at most the least part.
#[test]
fn a_silent_router_that_comes_back_takes_at_most_the_least_part_away() {
    let rounds = |budget: &mut DailyBudget, rounds: std::ops::RangeInclusive<u32>, live, silent| {
        for round in rounds {
            let share = shared(round, live, silent, 0);
            assert!(budget.admit(MONDAY, 0, None, share).is_ok());
        }
    };
    let mut budget = DailyBudget::new(MONDAY, 100_000);
    budget.apply_remote(MONDAY, 52_000);
    rounds(&mut budget, 1..=7, 3, 0);
    // Router-0 shows silent with 48,000 left: a part of 16,000.
    rounds(&mut budget, 8..=8, 2, 1);
    budget.apply_remote(MONDAY, 30_000);
    rounds(&mut budget, 9..=20, 2, 1);
    // 18,000 left; router-2 shows silent too (a part of 6,000 of them), then comes back.
    assert!(budget.admit(MONDAY, 0, None, shared(21, 1, 2, 0)).is_err());
    let mut spent = 0;
    for round in 22..=40 {
        while budget
            .admit(MONDAY, 100, None, shared(round, 2, 1, 0))
            .is_ok()
        {
            spent += 100;
        }
    }
    // What is left beside router-0's 16,000: 2,000, spent a half of the rest each round.
    // Halved, the reserve would have held 11,000 of its 16,000, and 7,000 could be spent.
    assert!((1_500..=2_000).contains(&spent), "spent {spent}");
}

use super::*;
use std::collections::HashMap;

const MONDAY: Day = Day(20_000);
const TUESDAY: Day = Day(20_001);
const CHAT: ModelId = ModelId(1);
const EMBED: ModelId = ModelId(2);

fn serverless(model: ModelId) -> ModelContext {
    ModelContext {
        model,
        healthy_replicas: 1,
        serverless: true,
    }
}

fn estimate(input_tokens: u64) -> Estimate {
    Estimate {
        input_tokens,
        max_output_tokens: None,
    }
}

fn flat(rpm: u64, per_day: u64, itpm: u64, otpm: u64) -> KeyLimits {
    let quota = KeyQuota::Flat(FlatQuota {
        requests_per_minute: rpm,
        tokens_per_day: per_day,
        input_tokens_per_minute: itpm,
        output_tokens_per_minute: otpm,
    });
    KeyLimits::new(Millis(0), MONDAY, &quota, BurstSeconds::FULL_MINUTE).unwrap()
}

#[test]
fn unlimited_key_admits_everything() {
    let mut key = flat(0, 0, 0, 0);
    for _ in 0..1000 {
        let admission = key
            .admit(
                Millis(0),
                MONDAY,
                &serverless(CHAT),
                estimate(1_000_000),
                Share::Whole,
            )
            .unwrap();
        assert_eq!(admission.remaining_requests, None);
        assert_eq!(admission.remaining_tokens, None);
        key.settle(
            Millis(0),
            MONDAY,
            admission.charge,
            UsedTokens::default(),
            Delivery::Streamed,
        );
    }
    assert!(key.is_idle(Millis(0), MONDAY));
}

#[test]
fn rpm_rejection_has_no_retry_after_and_reports_zero_remaining() {
    let mut key = flat(2, 0, 0, 0);
    let model = serverless(CHAT);
    assert_eq!(
        key.admit(Millis(0), MONDAY, &model, estimate(1), Share::Whole)
            .unwrap()
            .remaining_requests,
        Some(1)
    );
    let _ = key
        .admit(Millis(0), MONDAY, &model, estimate(1), Share::Whole)
        .unwrap();
    let rejection = key
        .admit(Millis(0), MONDAY, &model, estimate(1), Share::Whole)
        .unwrap_err();
    assert_eq!(rejection.kind, RejectionKind::RequestRate);
    assert_eq!(rejection.kind.code(), "rate_limit_exceeded");
    assert_eq!(rejection.retry_after_seconds, None);
    assert_eq!(rejection.remaining_requests, Some(0));
    assert_eq!((rejection.limit, rejection.reset_seconds), (2, Some(30)));
}

#[test]
fn b4_rejections_retry_after_one_and_output_checked_before_input() {
    let mut key = flat(0, 0, 1000, 500);
    let model = serverless(CHAT);
    let admission = key
        .admit(Millis(0), MONDAY, &model, estimate(100), Share::Whole)
        .unwrap();
    key.settle(
        Millis(0),
        MONDAY,
        admission.charge,
        UsedTokens {
            input_tokens: 100,
            output_tokens: 10_000,
        },
        Delivery::Streamed,
    );
    // The output bucket is drained: the next request is refused before ITPM is touched.
    let rejection = key
        .admit(Millis(0), MONDAY, &model, estimate(2000), Share::Whole)
        .unwrap_err();
    assert_eq!(rejection.kind, RejectionKind::OutputTokenRate);
    assert_eq!(rejection.retry_after_seconds, Some(1));
    // One minute later (one capacity of debt), output is back; the estimate is over ITPM.
    let later = Millis::from_seconds(61);
    let rejection = key
        .admit(later, MONDAY, &model, estimate(2000), Share::Whole)
        .unwrap_err();
    assert_eq!(rejection.kind, RejectionKind::InputTokenRate);
    assert_eq!(
        rejection.kind.message(),
        "input token rate exceeded, please retry"
    );
    assert_eq!(rejection.retry_after_seconds, Some(1));
    assert_eq!(rejection.reset_seconds, None);
    let _ = key
        .admit(later, MONDAY, &model, estimate(1000), Share::Whole)
        .unwrap();
}

#[test]
fn b4_buckets_are_per_model_and_skipped_for_reserved_models() {
    let mut key = flat(0, 0, 1000, 0);
    let _ = key
        .admit(
            Millis(0),
            MONDAY,
            &serverless(CHAT),
            estimate(1000),
            Share::Whole,
        )
        .unwrap();
    let _ = key
        .admit(
            Millis(0),
            MONDAY,
            &serverless(EMBED),
            estimate(1000),
            Share::Whole,
        )
        .unwrap();
    let reserved = ModelContext {
        serverless: false,
        ..serverless(CHAT)
    };
    let _ = key
        .admit(Millis(0), MONDAY, &reserved, estimate(1000), Share::Whole)
        .unwrap();
    assert!(
        key.admit(
            Millis(0),
            MONDAY,
            &serverless(CHAT),
            estimate(1),
            Share::Whole
        )
        .is_err()
    );
}

#[test]
fn daily_refusal_gives_back_the_input_rate_charge() {
    let mut key = flat(0, 1000, 800, 0);
    let model = serverless(CHAT);
    let refused = key
        .admit(
            Millis(0),
            MONDAY,
            &model,
            Estimate {
                input_tokens: 600,
                max_output_tokens: Some(500),
            },
            Share::Whole,
        )
        .unwrap_err();
    assert_eq!(refused.kind, RejectionKind::DailyTokensForMaxOutput);
    assert_eq!(refused.kind.code(), "token_limit_exceeded");
    assert_eq!(refused.remaining, 1000);
    assert_eq!(refused.retry_after_seconds, None);
    // ITPM is whole again: 800 still fits.
    let admission = key
        .admit(Millis(0), MONDAY, &model, estimate(800), Share::Whole)
        .unwrap();
    assert_eq!(admission.remaining_tokens, Some(200));
    key.cancel(admission.charge);
    assert!(key.is_idle(Millis(0), MONDAY));
}

#[test]
fn settle_trues_up_input_and_charges_output() {
    let mut key = flat(0, 10_000, 5000, 5000);
    let model = serverless(CHAT);
    let admission = key
        .admit(Millis(0), MONDAY, &model, estimate(1000), Share::Whole)
        .unwrap();
    let settlement = key.settle(
        Millis(0),
        MONDAY,
        admission.charge,
        UsedTokens {
            input_tokens: 800,
            output_tokens: 300,
        },
        Delivery::Streamed,
    );
    assert!(settlement.output_fit);
    assert_eq!(settlement.remaining_tokens, Some(8_900));
    let mut deltas = Vec::new();
    key.take_deltas(|bucket, amount| deltas.push((bucket, amount)));
    assert_eq!(
        deltas,
        vec![
            (
                BucketRef::Daily {
                    model: None,
                    day: MONDAY
                },
                1100
            ),
            (BucketRef::InputTokens { model: CHAT }, 1000),
            (BucketRef::OutputTokens { model: CHAT }, 300),
        ]
    );
}

#[test]
fn buffered_output_over_budget_is_refused_and_provider_charges_nothing_after() {
    let mut key = flat(0, 1000, 0, 100);
    let model = serverless(CHAT);
    let admission = key
        .admit(Millis(0), MONDAY, &model, estimate(900), Share::Whole)
        .unwrap();
    let settlement = key.settle(
        Millis(0),
        MONDAY,
        admission.charge,
        UsedTokens {
            input_tokens: 900,
            output_tokens: 200,
        },
        Delivery::Buffered,
    );
    assert!(!settlement.output_fit);
    assert_eq!(settlement.remaining_tokens, Some(0));
    let admission = key.admit(Millis(0), MONDAY, &model, estimate(50), Share::Whole);
    // OTPM was drained by the 200 output tokens, which the engine did produce.
    assert_eq!(admission.unwrap_err().kind, RejectionKind::OutputTokenRate);
    let later = Millis::from_seconds(120);
    let admission = key
        .admit(later, MONDAY, &model, estimate(50), Share::Whole)
        .unwrap();
    let settlement = key.settle(
        later,
        MONDAY,
        admission.charge,
        UsedTokens {
            input_tokens: 5,
            output_tokens: 10_000,
        },
        Delivery::Provider,
    );
    assert_eq!(settlement.remaining_tokens, Some(50));
    let _ = key
        .admit(later, MONDAY, &model, estimate(50), Share::Whole)
        .unwrap();
}

#[test]
fn per_model_quota_is_strict_and_scales_with_replicas() {
    let quota = KeyQuota::PerModel(vec![
        ModelQuota {
            model: CHAT,
            requests_per_minute_per_replica: 2,
            tokens_per_day: 1000,
        },
        ModelQuota {
            model: EMBED,
            requests_per_minute_per_replica: 0,
            tokens_per_day: 0,
        },
    ]);
    let mut key = KeyLimits::new(Millis(0), MONDAY, &quota, BurstSeconds::FULL_MINUTE).unwrap();
    let unlisted = serverless(ModelId(9));
    let rejection = key
        .admit(Millis(0), MONDAY, &unlisted, estimate(1), Share::Whole)
        .unwrap_err();
    assert_eq!(rejection.kind, RejectionKind::ModelNotInQuota);
    assert_eq!(rejection.kind.code(), "rate_limit_exceeded");
    let three_replicas = ModelContext {
        healthy_replicas: 3,
        ..serverless(CHAT)
    };
    for _ in 0..6 {
        let _ = key
            .admit_request(Millis(0), &three_replicas, Share::Whole)
            .unwrap();
    }
    assert!(
        key.admit_request(Millis(0), &three_replicas, Share::Whole)
            .is_err()
    );
    // No healthy replica: the rate check is skipped.
    let none = ModelContext {
        healthy_replicas: 0,
        ..serverless(CHAT)
    };
    assert_eq!(
        key.admit_request(Millis(0), &none, Share::Whole)
            .unwrap()
            .remaining_requests,
        None
    );
    // The daily budget does not scale with replicas, and is per model.
    let _ = key
        .admit_tokens(
            Millis(0),
            MONDAY,
            &three_replicas,
            estimate(1000),
            Share::Whole,
        )
        .unwrap();
    assert!(
        key.admit_tokens(
            Millis(0),
            MONDAY,
            &three_replicas,
            estimate(1),
            Share::Whole
        )
        .is_err()
    );
    let _ = key
        .admit_tokens(
            Millis(0),
            MONDAY,
            &serverless(EMBED),
            estimate(1_000_000),
            Share::Whole,
        )
        .unwrap();
}

#[test]
fn reload_keeps_usage_and_todays_total() {
    let mut key = flat(10, 1000, 500, 0);
    let model = serverless(CHAT);
    for _ in 0..4 {
        let admission = key
            .admit(Millis(0), MONDAY, &model, estimate(100), Share::Whole)
            .unwrap();
        let usage = UsedTokens {
            input_tokens: 100,
            output_tokens: 50,
        };
        key.settle(
            Millis(0),
            MONDAY,
            admission.charge,
            usage,
            Delivery::Streamed,
        );
    }
    let raised = KeyQuota::Flat(FlatQuota {
        requests_per_minute: 20,
        tokens_per_day: 2000,
        input_tokens_per_minute: 1000,
        output_tokens_per_minute: 0,
    });
    let mut reloaded = key
        .reconfigured(Millis(0), MONDAY, &raised, BurstSeconds::FULL_MINUTE)
        .unwrap();
    let admission = reloaded
        .admit(Millis(0), MONDAY, &model, estimate(600), Share::Whole)
        .unwrap();
    assert_eq!(admission.remaining_requests, Some(15));
    assert_eq!(admission.remaining_tokens, Some(2000 - 600 - 600));
    // ITPM kept its 400 used: 1000 - 400 - 600 = 0 left.
    let refused = reloaded
        .admit(Millis(0), MONDAY, &model, estimate(1), Share::Whole)
        .unwrap_err();
    assert_eq!(refused.kind, RejectionKind::InputTokenRate);
}

#[test]
fn daily_totals_are_walked_and_restored_per_bucket() {
    let mut key = flat(10, 1000, 0, 0);
    let model = serverless(CHAT);
    assert!(key.restore_daily(None, MONDAY, 600));
    assert!(
        !key.restore_daily(Some(CHAT), MONDAY, 1),
        "a flat key has no per-model budget"
    );
    let mut totals = Vec::new();
    key.take_changed_daily_totals(|model, day, total| totals.push((model, day, total)));
    assert!(totals.is_empty(), "a restored total is on disk already");
    let admission = key
        .admit(Millis(0), MONDAY, &model, estimate(100), Share::Whole)
        .unwrap();
    assert_eq!(admission.remaining_tokens, Some(300));
    key.take_changed_daily_totals(|model, day, total| totals.push((model, day, total)));
    assert_eq!(totals, vec![(None, MONDAY, 700)]);
    // The restored part is not a sync delta.
    let mut deltas = Vec::new();
    key.take_deltas(|bucket, amount| deltas.push((bucket, amount)));
    assert!(deltas.contains(&(
        BucketRef::Daily {
            model: None,
            day: MONDAY
        },
        100
    )));

    let quota = KeyQuota::PerModel(vec![
        ModelQuota {
            model: CHAT,
            requests_per_minute_per_replica: 0,
            tokens_per_day: 1000,
        },
        ModelQuota {
            model: EMBED,
            requests_per_minute_per_replica: 0,
            tokens_per_day: 500,
        },
    ]);
    let mut key = KeyLimits::new(Millis(0), MONDAY, &quota, BurstSeconds::FULL_MINUTE).unwrap();
    assert!(
        !key.restore_daily(None, MONDAY, 1),
        "a per-model key has no flat budget"
    );
    assert!(!key.restore_daily(Some(ModelId(9)), MONDAY, 1));
    assert!(key.restore_daily(Some(EMBED), MONDAY, 450));
    let refused = key
        .admit(
            Millis(0),
            MONDAY,
            &serverless(EMBED),
            estimate(51),
            Share::Whole,
        )
        .unwrap_err();
    assert_eq!(refused.remaining, 50);
    let _ = key
        .admit(
            Millis(0),
            MONDAY,
            &serverless(CHAT),
            estimate(10),
            Share::Whole,
        )
        .unwrap();
    let _ = key
        .admit(
            Millis(0),
            MONDAY,
            &serverless(EMBED),
            estimate(5),
            Share::Whole,
        )
        .unwrap();
    let mut totals = Vec::new();
    key.take_changed_daily_totals(|model, day, total| totals.push((model, day, total)));
    assert_eq!(
        totals,
        vec![(Some(CHAT), MONDAY, 10), (Some(EMBED), MONDAY, 455)]
    );
    // At midnight nothing is written until the new day is charged.
    let _ = key
        .admit(
            Millis(1),
            TUESDAY,
            &serverless(CHAT),
            estimate(7),
            Share::Whole,
        )
        .unwrap();
    totals.clear();
    key.take_changed_daily_totals(|model, day, total| totals.push((model, day, total)));
    assert_eq!(totals, vec![(Some(CHAT), TUESDAY, 7)]);
}

#[test]
fn invalid_quotas_are_refused() {
    let at = Millis(0);
    let burst = BurstSeconds::FULL_MINUTE;
    assert_eq!(
        KeyLimits::new(at, MONDAY, &KeyQuota::PerModel(vec![]), burst).unwrap_err(),
        LimitsConfigError::EmptyPerModel
    );
    let entry = ModelQuota {
        model: CHAT,
        requests_per_minute_per_replica: 1,
        tokens_per_day: 1,
    };
    assert_eq!(
        KeyLimits::new(at, MONDAY, &KeyQuota::PerModel(vec![entry, entry]), burst).unwrap_err(),
        LimitsConfigError::DuplicateModel(1)
    );
    let huge = KeyQuota::Flat(FlatQuota {
        tokens_per_day: LIMIT_MAX + 1,
        ..FlatQuota::default()
    });
    let error = KeyLimits::new(at, MONDAY, &huge, burst).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "tokens_per_day is {}, over the largest supported limit of {LIMIT_MAX}",
            LIMIT_MAX + 1
        )
    );
}

#[test]
fn daily_budget_resets_at_midnight_for_a_key() {
    let mut key = flat(0, 1000, 0, 0);
    let model = serverless(CHAT);
    let before_midnight = key
        .admit(Millis(0), MONDAY, &model, estimate(700), Share::Whole)
        .unwrap();
    let spent = key.admit(Millis(1), MONDAY, &model, estimate(400), Share::Whole);
    assert_eq!(spent.unwrap_err().kind, RejectionKind::DailyTokens);
    assert!(!key.is_idle(Millis::from_seconds(600), MONDAY));
    assert!(key.is_idle(Millis::from_seconds(600), TUESDAY));
    // Admitted Monday, settled Tuesday: only its output counts, against Tuesday.
    let settlement = key.settle(
        Millis(2),
        TUESDAY,
        before_midnight.charge,
        UsedTokens {
            input_tokens: 700,
            output_tokens: 100,
        },
        Delivery::Streamed,
    );
    assert_eq!(settlement.remaining_tokens, Some(900));
    let _ = key
        .admit(Millis(3), TUESDAY, &model, estimate(900), Share::Whole)
        .unwrap();
}

#[test]
fn remote_usage_counts_against_the_key() {
    let mut router_a = flat(10, 1000, 0, 0);
    let mut router_b = flat(10, 1000, 0, 0);
    let model = serverless(CHAT);
    let mut admitted = 0;
    for second in 0..=60u64 {
        let now = Millis::from_seconds(second);
        for _ in 0..3 {
            admitted += router_a
                .admit(now, MONDAY, &model, estimate(1), Share::Whole)
                .is_ok() as u64;
            admitted += router_b
                .admit(now, MONDAY, &model, estimate(1), Share::Whole)
                .is_ok() as u64;
        }
        let mut from_a = Vec::new();
        router_a.take_deltas(|bucket, amount| from_a.push((bucket, amount)));
        let mut from_b = Vec::new();
        router_b.take_deltas(|bucket, amount| from_b.push((bucket, amount)));
        for (bucket, amount) in from_b {
            router_a.apply_remote(now, bucket, amount, 0, Share::Whole);
        }
        for (bucket, amount) in from_a {
            router_b.apply_remote(now, bucket, amount, 0, Share::Whole);
        }
    }
    // 10 burst + 10 refilled over 60 s, plus at most one round's overshoot (3 + 3).
    assert!((20..=26).contains(&admitted), "admitted {admitted}");
}

#[test]
fn idle_keys_are_dropped_and_memory_stays_bounded_under_churn() {
    // Every minute 10 000 new keys each make one request; every five minutes the owner drops
    // idle keys. The map never holds more than the keys of the last five minutes plus one.
    let mut keys: HashMap<u64, KeyLimits> = HashMap::new();
    let mut next_key = 0u64;
    let mut largest = 0;
    for minute in 0..60u64 {
        let now = Millis::from_seconds(minute * 60);
        for _ in 0..10_000 {
            let key = keys
                .entry(next_key)
                .or_insert_with(|| flat(100, 0, 1000, 1000));
            next_key += 1;
            let admission = key.admit(now, MONDAY, &serverless(CHAT), estimate(10), Share::Whole);
            let admission = admission.unwrap();
            key.settle(
                now,
                MONDAY,
                admission.charge,
                UsedTokens::default(),
                Delivery::Streamed,
            );
        }
        if minute % 5 == 4 {
            keys.retain(|_, key| !key.is_idle(now, MONDAY));
            keys.shrink_to_fit();
        }
        largest = largest.max(keys.len());
    }
    assert!(largest <= 6 * 10_000, "largest {largest}");
    let later = Millis::from_seconds(61 * 60);
    keys.retain(|_, key| !key.is_idle(later, MONDAY));
    assert!(keys.is_empty());
    // A key that used a daily budget today is kept until the day is over.
    let mut daily = flat(0, 1000, 0, 0);
    let admission = daily
        .admit(
            Millis(0),
            MONDAY,
            &serverless(CHAT),
            estimate(1),
            Share::Whole,
        )
        .unwrap();
    daily.cancel(admission.charge);
    assert!(daily.is_idle(Millis(0), MONDAY));
    let _ = daily
        .admit(
            Millis(0),
            MONDAY,
            &serverless(CHAT),
            estimate(1),
            Share::Whole,
        )
        .unwrap();
    assert!(!daily.is_idle(later, MONDAY));
    assert!(daily.is_idle(later, TUESDAY));
}

#[test]
fn token_rate_models_per_key_are_bounded() {
    let mut key = flat(0, 0, 1000, 0);
    for model in 0..TOKEN_RATE_MODELS_MAX as u32 {
        let _ = key
            .admit(
                Millis(0),
                MONDAY,
                &serverless(ModelId(model)),
                estimate(1),
                Share::Whole,
            )
            .unwrap();
    }
    let refused = key.admit(
        Millis(0),
        MONDAY,
        &serverless(ModelId(TOKEN_RATE_MODELS_MAX as u32)),
        estimate(1),
        Share::Whole,
    );
    assert_eq!(refused.unwrap_err().kind, RejectionKind::InputTokenRate);
    // Once the old entries are full again they are reclaimed.
    let later = Millis::from_seconds(1);
    let _ = key
        .admit(
            later,
            MONDAY,
            &serverless(ModelId(TOKEN_RATE_MODELS_MAX as u32)),
            estimate(1),
            Share::Whole,
        )
        .unwrap();
    key.compact(Millis::from_seconds(2));
    assert!(key.token_rates.is_empty());
}

proptest::proptest! {
    /// Through the aggregate, over any interleaving of admits, settles and cancels within
    /// one day: requests admitted never exceed burst + rate x elapsed, and the daily total
    /// equals the exact usage of what was settled.
    #[test]
    fn aggregate_totals_add_up(
        steps in proptest::collection::vec(
            (0u64..3_000, 0u64..2_000, 0u64..2_000, 0u64..2_000, 0u8..3),
            1..150,
        ),
    ) {
        let rpm = 30;
        let mut key = flat(rpm, LIMIT_MAX, 0, 0);
        let model = serverless(CHAT);
        let mut now_ms = 0u64;
        let mut requests = 0u64;
        let mut exact_total = 0u64;
        for (advance_ms, estimated, exact_input, exact_output, outcome) in steps {
            now_ms += advance_ms;
            let now = Millis(now_ms);
            let Ok(admission) = key.admit(now, MONDAY, &model, estimate(estimated), Share::Whole) else {
                continue;
            };
            requests += 1;
            match outcome {
                0 => key.cancel(admission.charge),
                _ => {
                    let usage = UsedTokens { input_tokens: exact_input, output_tokens: exact_output };
                    key.settle(now, MONDAY, admission.charge, usage, Delivery::Streamed);
                    exact_total += exact_input + exact_output;
                }
            }
            proptest::prop_assert!(requests * 60_000 <= rpm * 60_000 + now_ms * rpm);
        }
        let mut daily_total = 0;
        key.take_deltas(|bucket, amount| {
            if matches!(bucket, BucketRef::Daily { .. }) {
                daily_total = amount;
            }
        });
        proptest::prop_assert_eq!(daily_total, exact_total);
    }
}

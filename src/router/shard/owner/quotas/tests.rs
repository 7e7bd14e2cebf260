//! Which holder each bucket lives in (owner or key), restoring persisted daily totals into
//! holders, and reporting changed ones.

use super::*;
use crate::base::ids::ModelId;
use crate::logic::auth::config::AuthConfig;
use crate::logic::auth::keys::AuthOutcome;
use crate::logic::limits::{BucketRef, RejectionKind};
use crate::logic::snapshot::ModelEntry;
use std::sync::Arc;

const MONDAY: Day = Day(20_000);
const TUESDAY: Day = Day(20_001);
const NOW_MS: i64 = 1_785_153_600_000;

const AUTH: &str = r#"
api:
  mode: api-key
  keys:
    - key_hash: "HASH_FLAT"
      key_preview: "sk-...flat"
      metadata: {name: "flat", owner: "acme"}
      quota: {tokens_per_day: 1000}
    - key_hash: "HASH_PER_MODEL"
      key_preview: "sk-...permodel"
      metadata: {name: "per-model", owner: "globex"}
      quota:
        per_model:
          chat: {requests_per_minute_per_replica: 100, tokens_per_day: 500}
          embed: {requests_per_minute_per_replica: 100, tokens_per_day: 300}
"#;

fn registry() -> Arc<KeyRegistry> {
    let text = AUTH
        .replace(
            "HASH_FLAT",
            &crate::logic::auth::key_hash::hash_key_hex("sk-flat"),
        )
        .replace(
            "HASH_PER_MODEL",
            &crate::logic::auth::key_hash::hash_key_hex("sk-permodel"),
        );
    Arc::new(KeyRegistry::from_config(
        &AuthConfig::from_yaml(&text).expect("test auth.yaml"),
    ))
}

fn key<'a>(registry: &'a KeyRegistry, raw: &str) -> &'a KeyRecord {
    match registry.authenticate(Some(raw.as_bytes()), NOW_MS) {
        AuthOutcome::Authenticated { key, .. } => key,
        _ => panic!("{raw} does not authenticate"),
    }
}

/// A snapshot serving `models` as LLMs, model `i` with id `i`.
fn snapshot(version: u64, models: &[&str]) -> RoutingSnapshot {
    RoutingSnapshot::new(
        version,
        models.iter().enumerate().map(|(index, name)| {
            (
                Box::<str>::from(*name),
                Capability::Llm,
                ModelEntry {
                    id: ModelId(index as u32),
                    owner_shard: 0,
                    healthy_agents: 1,
                    policy: std::sync::Arc::new(crate::logic::policy::ModelPolicy::built_in(
                        &Default::default(),
                    )),
                    hold_budget: None,
                    tokens_per_byte: Default::default(),
                },
            )
        }),
        Vec::new(),
    )
}

fn llm(name: &str) -> Option<ModelKey> {
    Some(ModelKey {
        name: name.into(),
        capability: Capability::Llm,
    })
}

fn context(id: u32) -> ModelContext {
    ModelContext {
        model: ModelId(id),
        healthy_replicas: 1,
        serverless: false,
    }
}

fn tokens(input_tokens: u64) -> Charge {
    Charge::RequestsAndTokens(Estimate {
        input_tokens,
        max_output_tokens: None,
    })
}

fn admit(
    quotas: &mut Quotas,
    day: Day,
    registry: &KeyRegistry,
    snapshot: &RoutingSnapshot,
    raw: &str,
    model: u32,
    input_tokens: u64,
) -> Result<Admitted, LimitExceeded> {
    let key_id = key(registry, raw).key_id;
    quotas.admit(
        Millis(0),
        day,
        registry,
        snapshot,
        key_id,
        &context(model),
        tokens(input_tokens),
    )
}

/// A reload that changes a key's quota reaches its holder even when the new registry sits
/// where the old one was freed: the holder compares registry versions, not addresses.
#[test]
fn a_reloaded_quota_applies_whatever_address_the_new_registry_has() {
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let first = registry();
    let first_version = first.version();
    assert!(admit(&mut quotas, MONDAY, &first, &snapshot, "sk-flat", 0, 900).is_ok());
    drop(first);
    // The same key with a daily budget of 100 tokens instead of 1000.
    let text = AUTH
        .replace(
            "HASH_FLAT",
            &crate::logic::auth::key_hash::hash_key_hex("sk-flat"),
        )
        .replace(
            "HASH_PER_MODEL",
            &crate::logic::auth::key_hash::hash_key_hex("sk-permodel"),
        )
        .replace("tokens_per_day: 1000", "tokens_per_day: 100");
    let second = KeyRegistry::from_config(&AuthConfig::from_yaml(&text).expect("auth.yaml"));
    assert!(second.version() > first_version);
    // 900 used of 1000 left room for 50 more; the reloaded budget of 100 has none.
    assert!(admit(&mut quotas, MONDAY, &second, &snapshot, "sk-flat", 0, 50).is_err());
}

#[test]
fn flat_total_is_restored_when_the_holder_is_built() {
    let registry = registry();
    let acme = key(&registry, "sk-flat").tenant_id;
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.restore(
        &RoutingSnapshot::default(),
        DailyRestore {
            day: MONDAY,
            records: vec![
                DailyRecord {
                    tenant: acme,
                    model: None,
                    day: MONDAY,
                    tokens: 600,
                    others: false,
                },
                // Another day's record is not restored.
                DailyRecord {
                    tenant: acme,
                    model: None,
                    day: Day(MONDAY.0 - 1),
                    tokens: 999,
                    others: false,
                },
            ],
        },
    );
    assert_eq!(quotas.restored_waiting(), 1);
    assert!(quotas.take_changed_daily_totals().is_empty());
    let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
    assert_eq!(admitted.remaining_tokens, Some(300));
    assert_eq!(quotas.restored_waiting(), 0, "applied once, then forgotten");
    assert_eq!(
        quotas.take_changed_daily_totals(),
        vec![DailyTotal {
            tenant: acme,
            model: None,
            day: MONDAY,
            tokens: 700
        }]
    );
    assert!(quotas.take_changed_daily_totals().is_empty());
    // A rebuild (new snapshot) inherits the usage and does not restore a second time.
    let newer = self::snapshot(2, &["chat"]);
    let admitted = admit(&mut quotas, MONDAY, &registry, &newer, "sk-flat", 0, 100).unwrap();
    assert_eq!(admitted.remaining_tokens, Some(200));
}

/// sk-flat's owner's total of `day` as the store holds it: this router's own, or the others'.
fn flat_total(registry: &KeyRegistry, day: Day, tokens: u64, others: bool) -> DailyRecord {
    DailyRecord {
        tenant: key(registry, "sk-flat").tenant_id,
        model: None,
        day,
        tokens,
        others,
    }
}

/// A read of the totals on `day` (no holder built from it yet).
fn restore(quotas: &mut Quotas, day: Day, records: Vec<DailyRecord>) {
    quotas.restore(&RoutingSnapshot::default(), DailyRestore { day, records });
}

/// A new run's first round read the totals and failed; the next read carries no own total
/// (they are read once). The own total still waiting for its holder stays: replaced, the run
/// forgot what it charged before its restart (`tests/shared_limits.rs`, a journal's usage).
#[test]
fn an_own_total_waiting_for_its_holder_survives_a_second_read() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let record = |tokens, others| flat_total(&registry, MONDAY, tokens, others);
    restore(
        &mut quotas,
        MONDAY,
        vec![record(600, false), record(100, true)],
    );
    restore(&mut quotas, MONDAY, vec![record(150, true)]);
    assert_eq!(
        quotas.restored_waiting(),
        2,
        "the own total and the newer others'"
    );
    // 600 of its own and 150 of the others' used of 1,000.
    let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
    assert_eq!(admitted.remaining_tokens, Some(150));
}

/// Read near midnight, the others' totals of the next day start it on the budgets built, as
/// their usage of it does: a router whose clock is behind counts what the others wrote of the
/// new day (`sync::simulation`, seed 4,818). So does this router's own (a previous run's, its
/// clock ahead: read at start, long-mode seed 39,903). Other days are ignored.
#[test]
fn the_others_totals_of_the_next_day_start_it_on_the_budgets_built() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let record = |day, tokens, others| flat_total(&registry, day, tokens, others);
    restore(&mut quotas, MONDAY, vec![record(MONDAY, 200, true)]);
    let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
    assert_eq!(
        admitted.remaining_tokens,
        Some(700),
        "Monday: 200 and 100 of 1,000"
    );
    restore(
        &mut quotas,
        MONDAY,
        vec![
            record(MONDAY, 250, true),
            record(TUESDAY, 300, true),
            record(TUESDAY, 50, false),
            record(Day(TUESDAY.0 + 1), 400, true),
        ],
    );
    // The clock still says Monday; the budget counts Tuesday from the others' 300 and its
    // own 50.
    let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
    assert_eq!(admitted.remaining_tokens, Some(550));
    let admitted = admit(
        &mut quotas,
        TUESDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        100,
    )
    .unwrap();
    assert_eq!(admitted.remaining_tokens, Some(450));
}

/// A run that starts before midnight by its clock reads its own total of the next day, which
/// its previous run (its clock ahead) charged, and starts that day from it once it gets there,
/// holder built or not. Dropped, a later whole write of its field lost it: the store 147 tokens
/// short for the rest of the day (`sync::simulation`, long-mode seed 39,903).
#[test]
fn this_routers_own_total_of_the_next_day_starts_it_once_the_day_comes() {
    let registry = registry();
    let acme = key(&registry, "sk-flat").tenant_id;
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    restore(
        &mut quotas,
        MONDAY,
        vec![flat_total(&registry, TUESDAY, 147, false)],
    );
    // A second read (no own totals) keeps it waiting.
    restore(&mut quotas, MONDAY, Vec::new());
    let admitted = admit(
        &mut quotas,
        TUESDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        100,
    )
    .unwrap();
    assert_eq!(admitted.remaining_tokens, Some(753), "147 and 100 of 1,000");
    assert_eq!(
        quotas.take_changed_daily_totals(),
        vec![DailyTotal {
            tenant: acme,
            model: None,
            day: TUESDAY,
            tokens: 247
        }],
        "its total holds its previous run's 147"
    );
}

#[test]
fn per_model_total_waits_for_its_model_to_be_served() {
    let registry = registry();
    let globex = key(&registry, "sk-permodel").tenant_id;
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.restore(
        &RoutingSnapshot::default(),
        DailyRestore {
            day: MONDAY,
            records: vec![
                DailyRecord {
                    tenant: globex,
                    model: llm("chat"),
                    day: MONDAY,
                    tokens: 450,
                    others: false,
                },
                DailyRecord {
                    tenant: globex,
                    model: llm("embed"),
                    day: MONDAY,
                    tokens: 100,
                    others: false,
                },
            ],
        },
    );
    // Only `embed` is served (id 0): its total applies, `chat`'s waits.
    let only_embed = snapshot(1, &["embed"]);
    let admitted = admit(
        &mut quotas,
        MONDAY,
        &registry,
        &only_embed,
        "sk-permodel",
        0,
        10,
    )
    .unwrap();
    assert_eq!(admitted.remaining_tokens, Some(300 - 100 - 10));
    assert_eq!(quotas.restored_waiting(), 1);
    // `chat` appears (id 1): the rebuild applies its total.
    let both = snapshot(2, &["embed", "chat"]);
    let refused = admit(&mut quotas, MONDAY, &registry, &both, "sk-permodel", 1, 51).unwrap_err();
    assert_eq!(refused.remaining, 50);
    assert_eq!(quotas.restored_waiting(), 0);
    let mut totals = quotas.take_changed_daily_totals();
    totals.sort_by_key(|total| total.model);
    assert_eq!(
        totals,
        vec![DailyTotal {
            tenant: globex,
            model: Some(ModelId(0)),
            day: MONDAY,
            tokens: 110
        }]
    );
}

#[test]
fn restored_totals_of_a_day_that_is_over_are_dropped() {
    let registry = registry();
    let acme = key(&registry, "sk-flat").tenant_id;
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.restore(
        &RoutingSnapshot::default(),
        DailyRestore {
            day: MONDAY,
            records: vec![DailyRecord {
                tenant: acme,
                model: None,
                day: MONDAY,
                tokens: 600,
                others: false,
            }],
        },
    );
    let admitted = admit(
        &mut quotas,
        TUESDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        100,
    )
    .unwrap();
    assert_eq!(admitted.remaining_tokens, Some(900));
    assert_eq!(quotas.restored_waiting(), 0);
    // Cleanup drops them too when no holder of theirs is ever built.
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.restore(
        &RoutingSnapshot::default(),
        DailyRestore {
            day: MONDAY,
            records: vec![DailyRecord {
                tenant: acme,
                model: None,
                day: MONDAY,
                tokens: 600,
                others: false,
            }],
        },
    );
    quotas.cleanup(Millis(0), MONDAY);
    assert_eq!(quotas.restored_waiting(), 1);
    quotas.cleanup(Millis(0), TUESDAY);
    assert_eq!(quotas.restored_waiting(), 0);
}

#[test]
fn a_dropped_holder_reports_its_last_change_and_requeued_totals_come_first() {
    let registry = registry();
    let acme = key(&registry, "sk-flat").tenant_id;
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.restore(
        &RoutingSnapshot::default(),
        DailyRestore {
            day: MONDAY,
            records: Vec::new(),
        },
    );
    let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
    let total = |tokens| DailyTotal {
        tenant: acme,
        model: None,
        day: MONDAY,
        tokens,
    };
    assert_eq!(quotas.take_changed_daily_totals(), vec![total(100)]);
    quotas.cancel(acme, admitted.admission.expect("a daily charge"));
    // Idle again: dropped, but the disk must learn the 100 were given back.
    quotas.cleanup(Millis(0), MONDAY);
    assert!(quotas.is_empty());
    let taken = quotas.take_changed_daily_totals();
    assert_eq!(taken, vec![total(0)]);
    // A report that never reached the control core goes out again, before newer totals.
    quotas.requeue_daily_totals(taken);
    let _ = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 40).unwrap();
    assert_eq!(
        quotas.take_changed_daily_totals(),
        vec![total(0), total(40)]
    );
}

#[test]
fn memory_backend_reports_nothing() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let _ = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
    assert!(quotas.take_changed_daily_totals().is_empty());
    quotas.requeue_daily_totals(vec![DailyTotal {
        tenant: TenantId(1),
        model: None,
        day: MONDAY,
        tokens: 1,
    }]);
    assert!(quotas.take_changed_daily_totals().is_empty());
}

const TWO_KEYS_ONE_OWNER: &str = r#"
api:
  mode: api-key
  keys:
    - key_hash: "HASH_FIRST"
      key_preview: "sk-...first"
      metadata: {name: "first", owner: "acme"}
      quota: {requests_per_minute: 5, tokens_per_day: 10000, input_tokens_per_minute: 100, output_tokens_per_minute: 50}
    - key_hash: "HASH_SECOND"
      key_preview: "sk-...second"
      metadata: {name: "second", owner: "acme"}
      quota: {requests_per_minute: 5, tokens_per_day: 10000, input_tokens_per_minute: 100, output_tokens_per_minute: 50}
"#;

fn two_keys_one_owner() -> KeyRegistry {
    let text = TWO_KEYS_ONE_OWNER
        .replace(
            "HASH_FIRST",
            &crate::logic::auth::key_hash::hash_key_hex("sk-first"),
        )
        .replace(
            "HASH_SECOND",
            &crate::logic::auth::key_hash::hash_key_hex("sk-second"),
        );
    KeyRegistry::from_config(&AuthConfig::from_yaml(&text).expect("test auth.yaml"))
}

fn serverless(id: u32) -> ModelContext {
    ModelContext {
        serverless: true,
        ..context(id)
    }
}

fn admit_serverless(
    quotas: &mut Quotas,
    registry: &KeyRegistry,
    snapshot: &RoutingSnapshot,
    raw: &str,
    model: u32,
    input_tokens: u64,
) -> Result<Admitted, LimitExceeded> {
    let key_id = key(registry, raw).key_id;
    quotas.admit(
        Millis(0),
        MONDAY,
        registry,
        snapshot,
        key_id,
        &serverless(model),
        tokens(input_tokens),
    )
}

/// Seed `admission-control.md`, B4: "The input and output buckets are independent for each
/// key-and-model combination": a key that spent its input tokens per minute leaves another key
/// of the same owner untouched, and each model of one key has its own.
#[test]
fn input_token_rates_are_per_key_and_model_not_per_owner() {
    let registry = two_keys_one_owner();
    let snapshot = snapshot(1, &["chat", "embed"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let first = admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 100).unwrap();
    let refused =
        admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 1).unwrap_err();
    assert_eq!(
        refused.kind,
        crate::logic::limits::RejectionKind::InputTokenRate
    );
    let second = admit_serverless(&mut quotas, &registry, &snapshot, "sk-second", 0, 100).unwrap();
    let other_model =
        admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 1, 100).unwrap();
    assert_eq!(quotas.len(), 1, "one owner");
    assert_eq!(quotas.token_rate_holders(), 2, "two keys");
    let acme = key(&registry, "sk-first").tenant_id;
    quotas.cancel(acme, first.admission.unwrap());
    quotas.cancel(acme, second.admission.unwrap());
    quotas.cancel(acme, other_model.admission.unwrap());
}

/// B4's output state is per key too: one key's output drains only its own bucket.
#[test]
fn output_token_rates_are_per_key() {
    let registry = two_keys_one_owner();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let acme = key(&registry, "sk-first").tenant_id;
    let first = admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 1).unwrap();
    let usage = UsedTokens {
        input_tokens: 1,
        output_tokens: 100,
    };
    let settled = quotas.settle(
        Millis(0),
        MONDAY,
        acme,
        first.admission.unwrap(),
        usage,
        Delivery::Streamed,
    );
    assert!(settled.is_some());
    let refused =
        admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 1).unwrap_err();
    assert_eq!(
        refused.kind,
        crate::logic::limits::RejectionKind::OutputTokenRate
    );
    let second = admit_serverless(&mut quotas, &registry, &snapshot, "sk-second", 0, 1).unwrap();
    quotas.cancel(acme, second.admission.unwrap());
}

/// The flat buckets the auth reference shares per owner stay shared: requests per minute and
/// the daily budget count both keys, and a daily refusal gives the key's input-rate charge back.
#[test]
fn requests_per_minute_and_the_daily_budget_stay_per_owner() {
    let text = TWO_KEYS_ONE_OWNER
        .replace(
            "HASH_FIRST",
            &crate::logic::auth::key_hash::hash_key_hex("sk-first"),
        )
        .replace(
            "HASH_SECOND",
            &crate::logic::auth::key_hash::hash_key_hex("sk-second"),
        )
        .replace("tokens_per_day: 10000", "tokens_per_day: 150");
    let registry = KeyRegistry::from_config(&AuthConfig::from_yaml(&text).expect("auth.yaml"));
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let acme = key(&registry, "sk-first").tenant_id;
    let first = admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 100).unwrap();
    assert_eq!(first.remaining_tokens, Some(50));
    // 60 fits the second key's own input rate (100) but not the owner's day (50 left).
    let refused =
        admit_serverless(&mut quotas, &registry, &snapshot, "sk-second", 0, 60).unwrap_err();
    assert_eq!(
        refused.kind,
        crate::logic::limits::RejectionKind::DailyTokens
    );
    // The refusal gave the second key's input charge back: its full 100 is there, and 50 of the
    // day's budget.
    let second = admit_serverless(&mut quotas, &registry, &snapshot, "sk-second", 0, 50).unwrap();
    assert_eq!(second.remaining_tokens, Some(0));
    assert_eq!(
        second.remaining_requests,
        Some(2),
        "5 per minute for the owner, 3 used"
    );
    quotas.cancel(acme, first.admission.unwrap());
    quotas.cancel(acme, second.admission.unwrap());
    let first_again =
        admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 0).unwrap();
    assert_eq!(first_again.remaining_requests, Some(1));
    quotas.cancel(acme, first_again.admission.unwrap());
}

/// A key's token-rate holder is dropped once its buckets are full again, like an owner's.
#[test]
fn idle_key_holders_are_dropped() {
    let registry = two_keys_one_owner();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let acme = key(&registry, "sk-first").tenant_id;
    for raw in ["sk-first", "sk-second"] {
        let admitted = admit_serverless(&mut quotas, &registry, &snapshot, raw, 0, 10).unwrap();
        let usage = UsedTokens {
            input_tokens: 10,
            output_tokens: 10,
        };
        let _ = quotas.settle(
            Millis(0),
            MONDAY,
            acme,
            admitted.admission.unwrap(),
            usage,
            Delivery::Streamed,
        );
    }
    quotas.cleanup(Millis::from_seconds(1), MONDAY);
    assert_eq!(quotas.token_rate_holders(), 2, "buckets still refilling");
    // Full again, while the owner's daily budget still counts today: only the keys' holders go.
    quotas.cleanup(Millis::from_seconds(61), MONDAY);
    assert_eq!(quotas.token_rate_holders(), 0);
    assert_eq!(quotas.len(), 1);
    // The key's next request rebuilds its holder: its input rate is enforced again.
    let key_id = key(&registry, "sk-first").key_id;
    let refused = quotas
        .admit(
            Millis::from_seconds(61),
            MONDAY,
            &registry,
            &snapshot,
            key_id,
            &serverless(0),
            tokens(101),
        )
        .unwrap_err();
    assert_eq!(
        refused.kind,
        crate::logic::limits::RejectionKind::InputTokenRate
    );
    assert_eq!(quotas.token_rate_holders(), 1);
    quotas.cleanup(Millis::from_seconds(200), TUESDAY);
    assert_eq!(quotas.token_rate_holders(), 0);
    assert!(quotas.is_empty());
}

#[test]
fn a_cleanup_that_drops_most_holders_gives_their_slots_back() {
    // 2,000 owners, one key each, with a requests-per-minute limit only: idle once full again.
    let owners = 2_000;
    let mut text = String::from("api:\n  mode: api-key\n  keys:\n");
    for index in 0..owners {
        text.push_str(&format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...{index}\"\n      \
             metadata: {{name: \"k{index}\", owner: \"owner-{index}\"}}\n      \
             quota: {{requests_per_minute: 10}}\n",
            crate::logic::auth::key_hash::hash_key_hex(&format!("sk-burst-{index}"))
        ));
    }
    let registry = KeyRegistry::from_config(&AuthConfig::from_yaml(&text).unwrap());
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let raw_keys: Vec<String> = (0..owners)
        .map(|index| format!("sk-burst-{index}"))
        .collect();
    for raw in &raw_keys {
        assert!(admit(&mut quotas, MONDAY, &registry, &snapshot, raw, 0, 10).is_ok());
    }
    assert_eq!(quotas.len(), owners);
    assert!(quotas.holder_slots() >= owners);

    // One owner keeps sending; the others' buckets are full again a minute later.
    let busy = key(&registry, &raw_keys[0]).key_id;
    let request = |quotas: &mut Quotas| {
        quotas
            .admit(
                Millis::from_seconds(60),
                MONDAY,
                &registry,
                &snapshot,
                busy,
                &context(0),
                tokens(10),
            )
            .unwrap();
    };
    request(&mut quotas);
    quotas.cleanup(Millis::from_seconds(61), MONDAY);
    assert_eq!(quotas.len(), 1);
    assert!(
        quotas.holder_slots() <= 64,
        "{} slots kept for one holder",
        quotas.holder_slots()
    );
}

// ----- sharing with the other routers of a site (`quotas::shared`) -----

fn remaining_tokens(admitted: Result<Admitted, LimitExceeded>) -> u64 {
    admitted
        .expect("admitted")
        .remaining_tokens
        .expect("a daily budget")
}

/// Usage published by another router for a key this router never served waits without a holder
/// (a few bytes, not a holder per key of the site); the first request here builds the holder
/// already charged: the key does not get a fresh budget here.
#[test]
fn remote_usage_waits_for_the_holder_and_charges_it_once_built() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let flat = key(&registry, "sk-flat").key_id;
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let usage = BucketUsage {
        key: flat,
        bucket: BucketRef::Daily {
            model: None,
            day: MONDAY,
        },
        amount: 600,
    };
    quotas.apply_remote(Millis(0), MONDAY, &registry, &snapshot, &usage, 0);
    assert_eq!(quotas.len(), 0, "no holder for a key only others served");
    assert_eq!(quotas.remote_only_tenants(), 1);
    let left = remaining_tokens(admit(
        &mut quotas,
        MONDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        100,
    ));
    assert_eq!(left, 300);
    assert_eq!(
        quotas.remote_only_tenants(),
        0,
        "applied once, then forgotten"
    );
}

/// Other routers' daily totals read again (a re-read after a gap) include the daily usage that
/// waited for the holder: it is not counted a second time when the holder is built.
#[test]
fn daily_usage_waiting_is_not_counted_again_after_the_totals_are_read() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let flat = key(&registry, "sk-flat");
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let usage = BucketUsage {
        key: flat.key_id,
        bucket: BucketRef::Daily {
            model: None,
            day: MONDAY,
        },
        amount: 600,
    };
    quotas.apply_remote(Millis(0), MONDAY, &registry, &snapshot, &usage, 0);
    quotas.restore(
        &snapshot,
        DailyRestore {
            day: MONDAY,
            records: vec![DailyRecord {
                tenant: flat.tenant_id,
                model: None,
                day: MONDAY,
                tokens: 600,
                others: true,
            }],
        },
    );
    let left = remaining_tokens(admit(
        &mut quotas,
        MONDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        100,
    ));
    assert_eq!(left, 300, "1,000 a day, 600 used elsewhere, 100 here");
}

/// The owner's requests per minute used through one key and another key's input tokens per
/// minute, both on other routers: the owner's reach the holder the first key builds here, the
/// other key's wait for that key's own holder.
#[test]
fn remote_rate_usage_reaches_the_holders_built_later() {
    let registry = two_keys_one_owner();
    let snapshot = snapshot(1, &["chat", "embed"]);
    let first = key(&registry, "sk-first").key_id;
    let second = key(&registry, "sk-second").key_id;
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    for (key, bucket, amount) in [
        (first, BucketRef::Requests { model: None }, 3),
        (second, BucketRef::InputTokens { model: ModelId(0) }, 100),
    ] {
        let usage = BucketUsage {
            key,
            bucket,
            amount,
        };
        quotas.apply_remote(Millis(0), MONDAY, &registry, &snapshot, &usage, 0);
    }
    assert_eq!(quotas.len() + quotas.token_rate_holders(), 0);
    let admitted = admit_serverless(&mut quotas, &registry, &snapshot, "sk-first", 0, 100).unwrap();
    assert_eq!(
        admitted.remaining_requests,
        Some(1),
        "5 a minute, 3 used elsewhere"
    );
    assert_eq!(
        quotas.remote_only_tenants(),
        1,
        "the second key's input tokens wait"
    );
    let refused =
        admit_serverless(&mut quotas, &registry, &snapshot, "sk-second", 0, 1).unwrap_err();
    assert_eq!(
        refused.kind,
        crate::logic::limits::RejectionKind::InputTokenRate
    );
    assert_eq!(quotas.remote_only_tenants(), 0);
}

/// What this router admitted is handed out once; what it took in from others is not.
#[test]
fn usage_is_handed_out_once_and_remote_usage_never() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let flat = key(&registry, "sk-flat").key_id;
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 40).unwrap();
    let tenant = key(&registry, "sk-flat").tenant_id;
    let used = UsedTokens {
        input_tokens: 40,
        output_tokens: 0,
    };
    let admission = admitted.admission.expect("a daily budget was charged");
    quotas.settle(
        Millis(0),
        MONDAY,
        tenant,
        admission,
        used,
        Delivery::Streamed,
    );
    let remote = BucketUsage {
        key: flat,
        bucket: BucketRef::Daily {
            model: None,
            day: MONDAY,
        },
        amount: 500,
    };
    quotas.apply_remote(Millis(0), MONDAY, &registry, &snapshot, &remote, 0);
    let mut out = Vec::new();
    quotas.take_usage(&mut out);
    assert_eq!(
        out,
        [BucketUsage {
            key: flat,
            bucket: BucketRef::Daily {
                model: None,
                day: MONDAY
            },
            amount: 40,
        }]
    );
    out.clear();
    quotas.take_usage(&mut out);
    assert!(out.is_empty());
}

/// Until today's totals are read, a key with a daily budget is refused at once; a key without
/// one is not affected. Reading the others' totals twice counts them once.
#[test]
fn a_daily_key_waits_for_the_totals_and_reading_them_twice_counts_once() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.share_through_store(MONDAY);
    let refused = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 1).unwrap_err();
    assert_eq!(refused.kind, RejectionKind::DailyTokens);
    let tenant = key(&registry, "sk-flat").tenant_id;
    let others = |tokens| DailyRestore {
        day: MONDAY,
        records: vec![DailyRecord {
            tenant,
            model: None,
            day: MONDAY,
            tokens,
            others: true,
        }],
    };
    quotas.restore(&snapshot, others(300));
    let left = remaining_tokens(admit(
        &mut quotas,
        MONDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        100,
    ));
    assert_eq!(left, 600);
    // A second read (after an outage): the others have 350 now, not 650.
    quotas.restore(&snapshot, others(350));
    let left = remaining_tokens(admit(
        &mut quotas,
        MONDAY,
        &registry,
        &snapshot,
        "sk-flat",
        0,
        0,
    ));
    assert_eq!(left, 550);
}

/// A holder dropped as idle between two rounds hands its unpublished usage over first.
#[test]
fn cleanup_keeps_the_usage_of_holders_it_drops_for_the_next_round() {
    let registry = registry();
    let snapshot = snapshot(1, &["chat"]);
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.share_through_store(MONDAY);
    quotas.restore(
        &snapshot,
        DailyRestore {
            day: MONDAY,
            records: Vec::new(),
        },
    );
    let key_id = key(&registry, "sk-permodel").key_id;
    quotas
        .admit(
            Millis(0),
            MONDAY,
            &registry,
            &snapshot,
            key_id,
            &context(0),
            Charge::RequestsOnly,
        )
        .unwrap();
    // Two minutes on, the RPM bucket is full again and the holder idle (no daily usage).
    quotas.cleanup(Millis(120_000), MONDAY);
    assert!(quotas.is_empty(), "dropped as idle");
    let mut out = Vec::new();
    quotas.take_usage(&mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].amount, 1);
}

fn ahead(input_tokens: u64) -> Charge {
    Charge::Ahead(Estimate {
        input_tokens,
        max_output_tokens: None,
    })
}

fn tokens_only(input_tokens: u64) -> Charge {
    Charge::TokensOnly(Estimate {
        input_tokens,
        max_output_tokens: None,
    })
}

/// `charge` for `sk-permodel` on `chat` (100 requests a minute, 500 tokens a day), on Monday.
fn admit_per_model(
    quotas: &mut Quotas,
    registry: &KeyRegistry,
    charge: Charge,
) -> Result<Admitted, LimitExceeded> {
    let id = key(registry, "sk-permodel").key_id;
    let snapshot = snapshot(1, &["chat"]);
    quotas.admit(
        Millis(0),
        MONDAY,
        registry,
        &snapshot,
        id,
        &context(0),
        charge,
    )
}

/// With room in the token phase, a charge ahead of the gates is the two phases in one.
#[test]
fn a_token_phase_ahead_with_room_charges_like_both_phases() {
    let registry = registry();
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let admitted = admit_per_model(&mut quotas, &registry, ahead(100)).expect("room");
    assert!(admitted.admission.is_some(), "the tokens are charged");
    assert_eq!(admitted.remaining_tokens, Some(400));
    assert_eq!(admitted.remaining_requests, Some(99));
}

/// A token phase ahead that the key does not pass is no refusal and charges nothing: the
/// request unit stays charged, and the token phase runs again after the gates, where it is
/// refused in its place in the gate order.
#[test]
fn a_token_phase_ahead_without_room_charges_the_request_unit_alone() {
    let registry = registry();
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    let admitted =
        admit_per_model(&mut quotas, &registry, ahead(600)).expect("the request unit passes");
    assert!(admitted.admission.is_none(), "no token charge");
    assert_eq!(admitted.remaining_tokens, None);
    assert_eq!(
        admitted.remaining_requests,
        Some(99),
        "the request unit is charged"
    );
    // The whole day's budget is still there.
    let whole = admit_per_model(&mut quotas, &registry, tokens_only(500)).expect("500 fit");
    assert_eq!(whole.remaining_tokens, Some(0));
}

/// While today's totals are unread (routers sharing a store), a charge ahead admits the request
/// unit alone; the token phase after the gates is the one refused.
#[test]
fn a_token_phase_ahead_leaves_an_unknown_day_to_the_token_phase() {
    let registry = registry();
    let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
    quotas.share_through_store(MONDAY);
    let admitted =
        admit_per_model(&mut quotas, &registry, ahead(10)).expect("the request unit passes");
    assert!(admitted.admission.is_none());
    assert_eq!(admitted.remaining_requests, Some(99));
    let refused = admit_per_model(&mut quotas, &registry, tokens_only(10))
        .expect_err("today's total is unknown");
    assert_eq!(refused.kind, RejectionKind::DailyTokens);
}

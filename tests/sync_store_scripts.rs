//! The store's scripts run by their SHA1 in a real Valkey (issue 33, "The round's cost on the
//! wire"): a script cache emptied between rounds (`SCRIPT FLUSH`, as a restart or a failover
//! empties it) fails no round and loses no grant, no entry and no daily token; the round's packed
//! daily totals land in the same fields, with the same values, as a `HINCRBY` per total writes
//! (the plain commands a store refusing scripts still gets); once a script is cached its text is
//! not sent again; a round reads none of its own entries back and misses none of another's; the
//! totals carry the newest batch of each run they hold (`sync::counted`); and
//! through the binaries, a router with occupancy and daily budgets rides a flush after each
//! request.

mod common;

use common::runtime;

use common::poll;
use common::valkey::{RoundExtras, Valkey, ValkeyOptions};
use hivenet_router::base::ids::{Capability, KeyId, TenantId};
use hivenet_router::logic::limits::Day;
use hivenet_router::logic::snapshot::ModelKey;
use hivenet_router::router::sync::counted;
use hivenet_router::router::sync::daily_fields::{daily_field, daily_records};
use hivenet_router::router::sync::entry::{Bucket, Entry, KeyUsage};
use hivenet_router::router::sync::pool_store::{self, Grant};
use hivenet_router::router::sync::round::DailyWrite;
use hivenet_router::router::sync::store::{DailyRow, PoolRewrite, PoolWrite, Store, StreamId};

const SITE: &str = "scripts";
const EPOCH: &str = "epoch-1";
const ROUTER: &str = "router-0";
const PASSWORD: &str = "scripts-secret";
const DAY: u32 = 20_426;

fn store(valkey: &Valkey) -> Store {
    common::valkey::sync_store(valkey, SITE, ROUTER)
}

fn chat() -> ModelKey {
    ModelKey {
        name: "chat|v2".into(),
        capability: Capability::Llm,
    }
}

fn row(day: u32, tenant: u32, model: Option<ModelKey>, write: DailyWrite) -> DailyRow {
    DailyRow {
        day,
        tenant: TenantId(tenant),
        field: daily_field(ROUTER, TenantId(tenant), model.as_ref()),
        model,
        write,
    }
}

/// One round of `store` writing `entries` (any bytes: the store reads the rate usage of those
/// that decode, and writes the others all the same) and `totals`.
async fn round(store: &mut Store, entries: &[Vec<u8>], totals: &[DailyRow]) {
    common::valkey::round(store, entries, totals, RoundExtras::default()).await;
}

/// The day's hash as (field, value), sorted.
fn daily(valkey: &Valkey, day: u32) -> Vec<(String, String)> {
    valkey.hash(&format!("hivenet:{{{SITE}}}:daily:{day}"))
}

fn stream_length(valkey: &Valkey) -> u64 {
    valkey
        .command(&["XLEN", &format!("hivenet:{{{SITE}}}:usage")])
        .parse()
        .unwrap()
}

#[test]
fn a_flushed_script_cache_fails_no_round_and_loses_no_grant() {
    let valkey = Valkey::primary();
    valkey.command(&["SET", &format!("hivenet:{{{SITE}}}:epoch"), EPOCH]);
    let mut store = store(&valkey);
    runtime().block_on(async {
        let granted = store
            .grant("chat", ROUTER, 1, EPOCH, 10, 100)
            .await
            .unwrap();
        assert_eq!(
            granted,
            Grant::Granted {
                granted: 10,
                held: 10
            }
        );
        valkey.command(&["SCRIPT", "FLUSH"]);
        let granted = store.grant("chat", ROUTER, 1, EPOCH, 5, 100).await.unwrap();
        assert_eq!(
            granted,
            Grant::Granted {
                granted: 5,
                held: 15
            }
        );

        round(
            &mut store,
            &[b"first".to_vec()],
            &[row(DAY, 7, None, DailyWrite::Add(300))],
        )
        .await;
        valkey.command(&["SCRIPT", "FLUSH"]);
        round(
            &mut store,
            &[b"second".to_vec()],
            &[row(DAY, 7, None, DailyWrite::Add(40))],
        )
        .await;
        assert_eq!(stream_length(&valkey), 2, "an entry was lost");
        assert_eq!(
            daily(&valkey, DAY),
            vec![(daily_field(ROUTER, TenantId(7), None), "340".to_string())]
        );

        valkey.command(&["SCRIPT", "FLUSH"]);
        let read = store
            .pools(&[PoolWrite {
                pool: "chat",
                rewrite: Some(PoolRewrite {
                    epoch: EPOCH,
                    run: 1,
                    holding: 12,
                    in_use: 3,
                    short: false,
                }),
            }])
            .await
            .unwrap();
        assert!(read.refused.is_none());
        assert_eq!(read.pools[0].rewritten, Some(0));
        assert_eq!(read.pools[0].holdings[ROUTER], "1:12:0");

        valkey.command(&["SCRIPT", "FLUSH"]);
        assert_eq!(store.release_holdings(ROUTER, 1).await.unwrap(), 1);
    });
    assert_eq!(
        valkey.command(&["EXISTS", &format!("hivenet:{{{SITE}}}:pool:chat")]),
        "0"
    );
}

/// The writes of a round at midnight: increments and whole totals, flat and per-model budgets
/// (a model name holding the field separator), two days.
fn midnight_totals() -> Vec<DailyRow> {
    vec![
        row(DAY, 0x00ab_cdef, None, DailyWrite::Add(1)),
        row(
            DAY,
            0xffff_ffff,
            Some(chat()),
            DailyWrite::Add(123_456_789_012),
        ),
        row(DAY, 3, Some(chat()), DailyWrite::Set(77)),
        row(DAY + 1, 0x00ab_cdef, None, DailyWrite::Add(200)),
        row(
            DAY + 1,
            4,
            Some(ModelKey {
                name: "embed".into(),
                capability: Capability::Embedding,
            }),
            DailyWrite::Set(5),
        ),
    ]
}

#[test]
fn packed_totals_land_where_a_hincrby_per_total_writes_them() {
    let scripted = Valkey::primary();
    // A store whose ACL refuses scripts gets the plain commands (`HINCRBY` per total).
    let plain = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    plain.command(&["ACL", "SETUSER", "default", "-eval", "-evalsha"]);
    for valkey in [&scripted, &plain] {
        // What was there before is added to, and a whole total replaces it.
        let key = format!("hivenet:{{{SITE}}}:daily:{DAY}");
        valkey.command(&[
            "HSET",
            &key,
            &daily_field(ROUTER, TenantId(3), Some(&chat())),
            "1000",
        ]);
        valkey.command(&[
            "HSET",
            &key,
            &daily_field(ROUTER, TenantId(0x00ab_cdef), None),
            "9",
        ]);
        valkey.command(&["HSET", &key, "router-1|00abcdef||", "50"]);
        let mut store = store(valkey);
        runtime().block_on(async {
            round(&mut store, &[b"e".to_vec()], &midnight_totals()).await;
            round(
                &mut store,
                &[],
                &[row(DAY, 0x00ab_cdef, None, DailyWrite::Add(10))],
            )
            .await;
        });
    }
    for day in [DAY, DAY + 1] {
        assert_eq!(daily(&scripted, day), daily(&plain, day), "day {day}");
        let ttl: i64 = scripted
            .command(&["TTL", &format!("hivenet:{{{SITE}}}:daily:{day}")])
            .parse()
            .unwrap();
        assert!(ttl > 86_400, "day {day}'s expiry: {ttl}");
    }
    assert_eq!(daily(&scripted, DAY), {
        let mut expected = vec![
            (
                daily_field(ROUTER, TenantId(0x00ab_cdef), None),
                "20".to_string(),
            ),
            (
                daily_field(ROUTER, TenantId(0xffff_ffff), Some(&chat())),
                "123456789012".to_string(),
            ),
            (
                daily_field(ROUTER, TenantId(3), Some(&chat())),
                "77".to_string(),
            ),
            ("router-1|00abcdef||".to_string(), "50".to_string()),
        ];
        expected.sort();
        expected
    });
    assert_eq!(stream_length(&scripted), 1);
    assert_eq!(stream_length(&plain), 1);
}

/// An entry of this router's run `run` admitted at `at`, with daily usage of `day` (or, with
/// none, rate usage only).
fn entry(run: u64, at: u64, day: Option<u32>) -> Vec<u8> {
    let bucket = match day {
        Some(day) => Bucket::Daily {
            model: None,
            day: Day(day),
        },
        None => Bucket::Requests { model: None },
    };
    Entry {
        router: ROUTER.into(),
        run,
        admitted_at_unix_ms: at,
        day: Day(day.unwrap_or(DAY)),
        models: Vec::new(),
        keys: vec![KeyUsage {
            key: KeyId(7),
            buckets: vec![(bucket, 10)],
        }],
    }
    .encode()
}

/// Issue 33, invariant 3 (`sync::counted`): beside its totals a round writes, per run, the newest
/// batch they hold, so that a router whose count of the others comes from these totals applies a
/// batch published again once. The script and the plain commands write the same; a day the round
/// writes no totals of, and a batch without daily usage, get no mark; another router reads them
/// with the totals, as the bound of its count.
#[test]
fn the_totals_carry_the_newest_batch_of_each_run_they_hold() {
    let scripted = Valkey::primary();
    let plain = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    plain.command(&["ACL", "SETUSER", "default", "-eval", "-evalsha"]);
    let entries = [
        // A previous run's batch (its journal), then this run's, oldest first.
        entry(3, 800, Some(DAY)),
        entry(5, 1_000, Some(DAY)),
        entry(5, 1_500, Some(DAY)),
        entry(5, 1_600, Some(DAY + 2)),
        entry(5, 1_700, None),
    ];
    for valkey in [&scripted, &plain] {
        let mut store = store(valkey);
        runtime().block_on(round(&mut store, &entries, &midnight_totals()));
    }
    for day in [DAY, DAY + 1, DAY + 2] {
        assert_eq!(daily(&scripted, day), daily(&plain, day), "day {day}");
    }
    let marks: Vec<(String, String)> = daily(&scripted, DAY)
        .into_iter()
        .filter(|(field, _)| field.starts_with('|'))
        .collect();
    assert_eq!(
        marks,
        vec![
            (counted::published_field(ROUTER, 3), "800".to_string()),
            (counted::published_field(ROUTER, 5), "1500".to_string()),
        ]
    );
    assert!(daily(&scripted, DAY + 2).is_empty(), "no totals, no mark");
    // Read by another router: its count of router-0 holds those batches, and only those.
    let mut other = common::valkey::sync_store(&scripted, SITE, "router-1");
    let mut days = runtime()
        .block_on(other.read_daily(&[DAY]))
        .expect("the read")
        .days;
    let (fields, memory) = days.pop().expect("the day's");
    let read = daily_records(
        "router-1",
        Day(DAY),
        fields
            .iter()
            .map(|(field, tokens)| (field.as_str(), *tokens)),
        memory
            .iter()
            .map(|(field, tokens)| (field.as_str(), *tokens)),
        false,
        |_, _| None,
    );
    let flat = &read.marks[&(TenantId(0x00ab_cdef), None)];
    assert!(flat.holds(ROUTER, 5, 1_500) && !flat.holds(ROUTER, 5, 1_501));
    assert!(flat.holds(ROUTER, 3, 800) && !flat.holds(ROUTER, 3, 801));
    assert_eq!(
        read.records
            .iter()
            .filter(|record| record.others)
            .map(|record| record.tokens)
            .sum::<u64>(),
        1 + 123_456_789_012 + 77,
        "the marks are no totals"
    );
}

#[test]
fn a_cached_script_is_not_sent_again() {
    let valkey = Valkey::primary();
    valkey.command(&["SET", &format!("hivenet:{{{SITE}}}:epoch"), EPOCH]);
    let mut store = store(&valkey);
    let totals = [row(DAY, 7, None, DailyWrite::Add(3))];
    let pools = [PoolWrite {
        pool: "chat",
        rewrite: Some(PoolRewrite {
            epoch: EPOCH,
            run: 1,
            holding: 2,
            in_use: 1,
            short: false,
        }),
    }];
    // A model's share pools differ in the key's ID only: each costs a few bytes (about 100
    // before they were packed, `pool_store::ROUND`), measured below.
    // Key IDs are hashes: spread them as the registry's are.
    let names: Vec<String> = (0..100u32)
        .map(|key| format!("llm|sim-model|share-{:08x}", key.wrapping_mul(0x9e37_79b1)))
        .collect();
    let many: Vec<PoolWrite> = names
        .iter()
        .map(|name| PoolWrite {
            pool: name,
            rewrite: Some(PoolRewrite {
                epoch: EPOCH,
                run: 1,
                holding: 2_000,
                // All in use: a first holding is never more (the others gave it up otherwise).
                in_use: 2_000,
                short: false,
            }),
        })
        .collect();
    let (rounds, pool_steps, step, read) = runtime().block_on(async {
        let mut rounds = Vec::new();
        let mut pool_steps = Vec::new();
        for _ in 0..3 {
            let from = store.written_bytes();
            round(&mut store, &[], &totals).await;
            rounds.push(store.written_bytes() - from);
            let from = store.written_bytes();
            store.pools(&pools).await.unwrap();
            pool_steps.push(store.written_bytes() - from);
        }
        let from = store.written_bytes();
        let read = store.pools(&many).await.unwrap();
        (rounds, pool_steps, store.written_bytes() - from, read)
    });
    eprintln!("round bytes {rounds:?}, pool step bytes {pool_steps:?}");
    // The first of each sends the script's text once more after NOSCRIPT; the others only its
    // SHA1, the same bytes every time.
    assert!(rounds[0] > rounds[1] + 1_000, "{rounds:?}");
    assert_eq!(rounds[1], rounds[2]);
    assert!(
        pool_steps[0] > pool_steps[1] + pool_store::ROUND.len() as u64,
        "{pool_steps:?}"
    );
    assert_eq!(pool_steps[1], pool_steps[2]);
    assert!(
        pool_steps[1] < 300,
        "a pool's rewrite and read: {pool_steps:?}"
    );
    assert!(store.read_bytes() > 0);
    assert!(read.pools.iter().all(|pool| pool.rewritten == Some(0)));
    assert_eq!(
        read.pools[99].holdings.get("router-0").map(String::as_str),
        Some("1:2000:0"),
        "the hundredth pool's name was rebuilt from the one before"
    );
    assert_eq!(
        valkey.command(&[
            "HGET",
            &format!("hivenet:{{{SITE}}}:pool:{}", names[99]),
            ROUTER
        ]),
        "1:2000:0",
        "under the site's prefix"
    );
    let per_pool = (step - pool_steps[1]) / 99;
    eprintln!("100 share pools: {step} bytes, {per_pool} a pool more");
    assert!(per_pool <= 20, "{per_pool} bytes a pool");
}

/// A router does not read its own entries back, and misses none of another's: the round reads
/// the stream before adding its own entries, in one transaction, so the next round reads after
/// them only when nothing came between. The same with the plain commands of a store that
/// refuses scripts.
#[test]
fn a_round_reads_no_entry_of_its_own_and_every_other() {
    // The first round that publishes (a1's; an idle round sends no script) finds the script
    // unknown (`NOSCRIPT`) and sends its text on its own, outside the read's transaction, as does
    // a4's after the flush: each of them is read back once.
    let scripted = Valkey::primary();
    assert_eq!(own_and_others_read(&scripted), vec!["a1", "b1", "a4"]);
    let plain = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    plain.command(&["ACL", "SETUSER", "default", "-eval", "-evalsha"]);
    assert_eq!(own_and_others_read(&plain), vec!["b1"]);
}

/// What router-0 reads through a sequence of rounds of its own, one of router-1's, and a
/// `SCRIPT FLUSH`.
fn own_and_others_read(valkey: &Valkey) -> Vec<String> {
    let mut mine = store(valkey);
    let mut other = store(valkey);
    let rounds = [
        (0, ""),
        (0, "a1"),
        (0, "a2"),
        (1, "b1"),
        (0, "a3"),
        (0, ""),
        (2, ""),
        (0, "a4"),
        (0, ""),
        (0, ""),
    ];
    runtime().block_on(async {
        let mut cursor = StreamId::default();
        let mut read = Vec::new();
        for (writer, entry) in rounds {
            let entries: Vec<&str> = [entry].into_iter().filter(|e| !e.is_empty()).collect();
            match writer {
                1 => {
                    reads(&mut other, StreamId::default(), &entries).await;
                }
                2 => {
                    valkey.command(&["SCRIPT", "FLUSH"]);
                }
                _ => {
                    let round = reads(&mut mine, cursor, &entries).await;
                    read.extend(
                        round
                            .entries
                            .iter()
                            .map(|(_, bytes)| String::from_utf8(bytes.clone()).unwrap()),
                    );
                    let newest = round
                        .entries
                        .last()
                        .map_or(cursor, |(id, _)| cursor.max(*id));
                    cursor = round.own_newest.map_or(newest, |own| newest.max(own));
                }
            }
        }
        read
    })
}

/// One round of `store` after `after`, publishing `entries`.
async fn reads(
    store: &mut Store,
    after: StreamId,
    entries: &[&str],
) -> hivenet_router::router::sync::store::RoundReads {
    let entries: Vec<Vec<u8>> = entries
        .iter()
        .map(|entry| entry.as_bytes().to_vec())
        .collect();
    common::valkey::round(
        store,
        &entries,
        &[],
        RoundExtras {
            after,
            ..RoundExtras::default()
        },
    )
    .await
}

/// Through the binaries: a router with an occupancy budget and a daily budget rides a
/// `SCRIPT FLUSH` after every request. No round fails, no credit call fails, every request is
/// admitted (its wallet refilled after each flush), and every token reaches the daily total.
#[test]
fn a_router_rides_a_script_flush_between_rounds() {
    const KEY: &str = "sk-scripts-flush";
    let valkey = Valkey::primary();
    // Settled: no first-deployment settle window before the first grant.
    valkey.command(&["SET", "hivenet:{default}:epoch", "1-an-earlier-router"]);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-it")
        .join(format!("scripts-flush-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(
        dir.join("policies/sim-model.yaml"),
        "models:\n  - sim-model\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: 4\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("auth.yaml"),
        format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...lush\"\n      metadata: {{name: flush, owner: flush}}\n      quota: {{tokens_per_day: 1000000}}\n",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(KEY.as_bytes()))
        ),
    )
    .unwrap();
    let store = valkey.addr();
    let policies = dir.join("policies").display().to_string();
    let auth = dir.join("auth.yaml").display().to_string();
    let site = common::Site::start(
        "scripts-flush",
        common::Options::new()
            .router_args(&[
                "--shards",
                "1",
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                &store,
                "--router-id",
                "router-0",
                "--sync-interval",
                "200ms",
                "--policy-model-dir",
                &policies,
                "--auth-config-file",
                &auth,
            ])
            .api_key(KEY)
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .agent(0, &["--capacity", "8"]),
    );
    site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    let body = common::chat("sim-model", false).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let rounds = || site.router_metric("hivenet_sync_tick_seconds_count");
    let mut used = 0;
    for _ in 0..5 {
        let response = common::request(site.http, raw.as_bytes());
        assert_eq!(response.status, 200, "{}\n{}", response.text(), site.logs());
        used += response.json()["usage"]["total_tokens"].as_u64().unwrap();
        valkey.command(&["SCRIPT", "FLUSH"]);
        let from = rounds();
        site.wait_metric("hivenet_sync_tick_seconds_count", move |v| v >= from + 2.0);
        assert_eq!(site.router_metric("hivenet_sync_up"), 1.0);
    }
    let stored = || valkey.daily_tokens("default");
    poll(common::WAIT, || (stored() == used).then_some(())).unwrap_or_else(|| {
        panic!(
            "{used} tokens used, {} in the store\n{}",
            stored(),
            site.logs()
        )
    });
    let metrics = site.router_metrics();
    for (name, labels) in [
        ("hivenet_sync_errors_total", &[("kind", "unreachable")][..]),
        ("hivenet_sync_errors_total", &[("kind", "permission")][..]),
        ("hivenet_occupancy_credit_errors_total", &[][..]),
    ] {
        assert_eq!(
            common::metric_sum(&metrics, name, labels),
            0.0,
            "{name} {labels:?}\n{}",
            site.logs()
        );
    }
}

/// The round's script writes the heartbeat last: a round whose usage the store refuses does
/// not show the router live beside it. Written on its own, the heartbeat of a router that had
/// been silent made the others count it live again and drop the part they kept for it, while
/// its usage waited in its journal (`sync::simulation`, seed 3,043). Here the day's totals
/// key holds a string: the script fails at its first read, and writes nothing.
#[test]
fn a_round_whose_usage_is_refused_writes_no_heartbeat() {
    let valkey = Valkey::primary();
    let mut store = store(&valkey);
    let routers = format!("hivenet:{{{SITE}}}:routers");
    let daily_key = format!("hivenet:{{{SITE}}}:daily:{DAY}");
    valkey.command(&["SET", &daily_key, "not a hash"]);
    let totals = [row(DAY, 7, None, DailyWrite::Add(10))];
    runtime().block_on(async {
        // The first call sends the script's text after NOSCRIPT: both ways fail alike.
        for _ in 0..2 {
            let refused = common::valkey::try_round(
                &mut store,
                &[b"e".to_vec()],
                &totals,
                RoundExtras::default(),
            )
            .await;
            assert!(refused.is_err(), "the store refused the usage");
            assert_eq!(valkey.command(&["HEXISTS", &routers, ROUTER]), "0");
            assert_eq!(stream_length(&valkey), 0, "nothing written");
        }
        valkey.command(&["DEL", &daily_key]);
        round(&mut store, &[b"e".to_vec()], &totals).await;
    });
    assert_eq!(valkey.command(&["HEXISTS", &routers, ROUTER]), "1");
    assert_eq!(stream_length(&valkey), 1);
}

//! Proves, with real routers sharing a real Valkey (seed `run-several-routers.md`), that a key's
//! limits hold across the routers of a site: three routers hammered together admit about what one
//! would, within one sync interval of usage; with the store gone each enforces its share and the
//! usage held back reaches the others, counted once; rate usage published again after the store
//! lost its data is counted once; a restarted router continues today's totals;
//! a Sentinel failover is followed; an agent given one router reaches every router; and a daily
//! budget is refused while today's totals cannot be read.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::valkey::{Sentinels, Valkey, ValkeyOptions};
use common::{Options, Response, Site, Stop, chat, metric_sum, metric_sum_present, poll, request};
use hivenet_router::router::sync::journal;
use sha2::{Digest, Sha256};

/// The routers of every site here, as the seed advises: `--sync-min-routers` = routers run.
const ROUTERS: usize = 3;
/// `--sync-interval`: short, so a test spans many rounds.
const INTERVAL: &str = "200ms";
/// The key the harness's own probes (`/v1/models`) present; it has no quota.
const PROBE_KEY: &str = "sk-shared-probe";
/// `--heartbeat-interval` of the discovery test's routers, and how many of them an agent may
/// take to reach a router that joins the site.
const HEARTBEAT: Duration = Duration::from_secs(1);
const HEARTBEATS_TO_REACH: u32 = 5;
/// Answer length of every sim: a request's cost is its exact prompt plus this.
const OUTPUT_TOKENS: &str = "4";

// ---------------------------------------------------------------------------------------------
// A site of routers

/// The longest a test here counts a daily budget, start-up included: it starts clear of
/// midnight by that much (`common::clear_of_midnight`).
const DAILY_TEST_SPAN: Duration = Duration::from_secs(180);

/// One key of the test's `auth.yaml`. Its owner is named after it: quota buckets belong to the
/// key's owner, so keys that must not share buckets must not share an owner.
struct Key {
    raw: &'static str,
    /// YAML lines under `quota:` (empty: no quota).
    quota: String,
}

fn key(raw: &'static str, quota: &str) -> Key {
    Key {
        raw,
        quota: quota.to_string(),
    }
}

fn rpm(requests_per_minute: u64) -> String {
    format!("requests_per_minute: {requests_per_minute}")
}

fn daily(tokens_per_day: u64) -> String {
    format!("tokens_per_day: {tokens_per_day}")
}

/// Writes an `auth.yaml` with the probe key and `keys`; returns its path.
fn auth_file(name: &str, keys: &[Key]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-shared-limits")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from("api:\n  mode: api-key\n  keys:\n");
    let probe = key(PROBE_KEY, "");
    for key in std::iter::once(&probe).chain(keys) {
        text.push_str(&format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...test\"\n      metadata:\n        name: \"{raw}\"\n        owner: \"{raw}\"\n",
            hex::encode(Sha256::digest(key.raw.as_bytes())),
            raw = key.raw,
        ));
        if !key.quota.is_empty() {
            text.push_str(&format!("      quota:\n        {}\n", key.quota));
        }
    }
    let path = dir.join("auth.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// How the routers of one test reach the store and what else they run with.
struct Plan {
    name: &'static str,
    auth: PathBuf,
    /// `--sync-valkey-addrs` and, for Sentinel, `--sync-valkey-sentinel-master`.
    store: Vec<String>,
    /// Extra router arguments.
    extra: Vec<String>,
    /// Extra router environment.
    env: Vec<(&'static str, &'static str)>,
    /// Each router has a sim and an agent of its own (otherwise none: agents come later).
    with_agent: bool,
    /// Each router keeps a `--sync-journal` in this directory.
    journals: Option<PathBuf>,
}

impl Plan {
    fn new(name: &'static str, auth: PathBuf, valkey_addrs: &str) -> Plan {
        Plan {
            name,
            auth,
            store: vec!["--sync-valkey-addrs".into(), valkey_addrs.into()],
            extra: Vec::new(),
            env: Vec::new(),
            with_agent: true,
            journals: None,
        }
    }

    /// Router `index` (`--router-id router-<index>`).
    fn options(&self, index: usize) -> Options {
        let id = format!("router-{index}");
        let min_routers = ROUTERS.to_string();
        let journal = self.journals.as_ref().map(|dir| dir.join(&id));
        let mut args: Vec<&str> = vec![
            "--auth-config-file",
            self.auth.to_str().unwrap(),
            "--shards",
            "1",
            "--sync-store",
            "valkey",
            "--router-id",
            &id,
            "--sync-interval",
            INTERVAL,
            "--sync-min-routers",
            &min_routers,
        ];
        args.extend(self.store.iter().map(String::as_str));
        args.extend(self.extra.iter().map(String::as_str));
        if let Some(journal) = &journal {
            args.extend(["--sync-journal", journal.to_str().unwrap()]);
        }
        let mut options = Options::new().api_key(PROBE_KEY).router_args(&args);
        for (key, value) in &self.env {
            options = options.router_env(key, value);
        }
        if self.with_agent {
            options
                .sim(&["--models", "sim-model", "--output-tokens", OUTPUT_TOKENS])
                .agent(0, &["--capacity", "64"])
        } else {
            options.skip_model_wait()
        }
    }

    fn start(&self, index: usize) -> Site {
        Site::start(&format!("{}-{index}", self.name), self.options(index))
    }

    /// Starts routers `0..count` together (each with its own sim and agent when the plan says).
    fn start_all(&self, count: usize) -> Vec<Site> {
        std::thread::scope(|scope| {
            let started: Vec<_> = (0..count)
                .map(|index| scope.spawn(move || self.start(index)))
                .collect();
            started.into_iter().map(|s| s.join().unwrap()).collect()
        })
    }
}

/// Waits until every router's `name` satisfies `predicate`.
fn wait_all(routers: &[Site], name: &str, predicate: impl Fn(f64) -> bool + Copy) {
    for router in routers {
        router.wait_metric(name, predicate);
    }
}

/// Waits until every router answers the store and sees the others live.
fn wait_site_up(routers: &[Site]) {
    wait_all(routers, "hivenet_sync_up", |v| v == 1.0);
    let others = (routers.len() - 1) as f64;
    wait_all(routers, "hivenet_sync_peers", move |v| v == others);
}

/// Restarts `valkey` without its data (it keeps none) and waits until every router noticed.
fn lose_the_stores_data(valkey: &mut Valkey, routers: &[Site]) {
    valkey.kill();
    valkey.restart();
    for router in routers {
        let noticed = poll(Duration::from_secs(30), || {
            router
                .logs()
                .contains("the sync store lost its data")
                .then_some(())
        });
        assert!(noticed.is_some(), "{}", router.logs());
    }
}

/// Sync rounds `router` has finished.
fn rounds(router: &Site) -> f64 {
    router.router_metric("hivenet_sync_tick_seconds_count")
}

/// Waits until `router` has finished `count` more rounds. Two rounds after some usage, a router
/// has published it (the round running when it was admitted may have taken its usage already).
fn wait_rounds(router: &Site, count: u32) {
    let from = rounds(router);
    router.wait_metric("hivenet_sync_tick_seconds_count", move |v| {
        v >= from + f64::from(count)
    });
}

/// Waits until usage admitted on `from` before this call has been applied by `to`: `from`
/// published it within two of its rounds, `to` read it within two of its own after that.
fn wait_propagated(from: &Site, to: &[&Site]) {
    wait_rounds(from, 2);
    for router in to {
        wait_rounds(router, 2);
    }
}

fn chat_request(key: &str) -> Vec<u8> {
    let body = chat("sim-model", false).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One chat for `key` on a fresh connection.
fn post(router: &Site, key: &str) -> Response {
    request(router.http, &chat_request(key))
}

/// A header's number; panics naming the response when it is missing.
fn header_number(response: &Response, name: &str) -> u64 {
    response
        .header(name)
        .unwrap_or_else(|| panic!("no {name} on {} {}", response.status, response.text()))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

fn remaining_requests(response: &Response) -> u64 {
    header_number(response, "x-ratelimit-remaining-requests")
}

fn remaining_tokens(response: &Response) -> u64 {
    header_number(response, "x-ratelimit-remaining-tokens")
}

/// One chat that must be admitted.
fn post_ok(router: &Site, key: &str) -> Response {
    let response = post(router, key);
    assert_eq!(
        response.status,
        200,
        "{key}: {}\n{}",
        response.text(),
        router.logs()
    );
    response
}

/// Sends `count` chats for `key` to `router` one after the other; returns how many were admitted.
/// Every refusal must be the key's rate limit.
fn admitted_of(router: &Site, key: &str, count: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..count {
        let response = post(router, key);
        match response.status {
            200 => admitted += 1,
            429 => assert_eq!(response.error_code(), "rate_limit_exceeded"),
            other => panic!("{key}: unexpected {other}: {}", response.text()),
        }
    }
    admitted
}

/// What the routers admitted while hammered: status and error code of every response.
#[derive(Default)]
struct Tally {
    admitted: usize,
    refused: Vec<String>,
    /// Prompt plus answer tokens of an admitted request, from its `usage`.
    cost: Option<u64>,
    /// The largest `X-RateLimit-Remaining-Tokens` of an admitted request.
    max_remaining_tokens: Option<u64>,
}

/// `clients` threads per router send chats for `key` on fresh connections, all routers at once,
/// until `stop` says so; returns what each router answered.
fn hammer(
    routers: &[Site],
    key: &'static str,
    clients: usize,
    mut stop: impl FnMut() -> bool,
) -> Vec<Tally> {
    let done = Arc::new(AtomicBool::new(false));
    let addrs: Vec<SocketAddr> = routers.iter().map(|r| r.http).collect();
    let threads: Vec<_> = addrs
        .iter()
        .flat_map(|addr| std::iter::repeat_n(*addr, clients))
        .map(|addr| {
            let done = done.clone();
            std::thread::spawn(move || {
                let raw = chat_request(key);
                let mut tally = Tally::default();
                // Bounded: a test that never stops still ends (the stop condition is polled for
                // 60 s at most; a client sends a few hundred requests a second).
                for _ in 0..100_000 {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let response = request(addr, &raw);
                    match response.status {
                        200 => {
                            tally.admitted += 1;
                            let usage = &response.json()["usage"];
                            tally.cost = usage["total_tokens"].as_u64();
                            if response.header("x-ratelimit-remaining-tokens").is_some() {
                                let remaining = remaining_tokens(&response);
                                tally.max_remaining_tokens =
                                    tally.max_remaining_tokens.max(Some(remaining));
                            }
                        }
                        429 => tally.refused.push(response.error_code()),
                        other => panic!("{key}: unexpected {other}: {}", response.text()),
                    }
                }
                (addr, tally)
            })
        })
        .collect();
    let stopped = poll(Duration::from_secs(60), || stop().then_some(()));
    done.store(true, Ordering::Relaxed);
    let mut per_router: Vec<Tally> = routers.iter().map(|_| Tally::default()).collect();
    for thread in threads {
        let (addr, tally) = thread.join().unwrap();
        let index = addrs.iter().position(|a| *a == addr).unwrap();
        per_router[index].admitted += tally.admitted;
        per_router[index].refused.extend(tally.refused);
        per_router[index].cost = per_router[index].cost.or(tally.cost);
        per_router[index].max_remaining_tokens = per_router[index]
            .max_remaining_tokens
            .max(tally.max_remaining_tokens);
    }
    assert!(stopped.is_some(), "the hammer's stop condition never held");
    per_router
}

/// Every refusal a hammer got was `code`.
fn refused_only_by(tallies: &[Tally], code: &str) {
    for tally in tallies {
        assert!(
            tally.refused.iter().all(|refused| refused == code),
            "refused other than {code}: {:?}",
            tally.refused
        );
    }
}

/// Stops a hammer once every router has finished `count` more sync rounds.
fn after_rounds(routers: &[Site], count: u32) -> impl FnMut() -> bool + '_ {
    let from: Vec<f64> = routers.iter().map(rounds).collect();
    move || {
        routers
            .iter()
            .zip(&from)
            .all(|(router, from)| rounds(router) >= from + f64::from(count))
    }
}

/// `tenant`'s input plus output tokens counted by every router.
fn tokens_used(routers: &[Site], tenant: &str) -> u64 {
    routers
        .iter()
        .map(|router| {
            let metrics = router.router_metrics();
            let labels = [("tenant_id", tenant)];
            metric_sum(&metrics, "hivenet_tenant_input_tokens_total", &labels)
                + metric_sum(&metrics, "hivenet_tenant_output_tokens_total", &labels)
        })
        .sum::<f64>() as u64
}

/// What a bucket refills in `elapsed` at `per_minute`, rounded up.
fn refill(per_minute: u64, elapsed: Duration) -> u64 {
    (elapsed.as_secs_f64() * per_minute as f64 / 60.0).ceil() as u64
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn one_key_over_three_routers_stays_within_its_rpm() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const RPM: u64 = 30;
    const BUDGET: u64 = 600;
    let valkey = Valkey::primary();
    let auth = auth_file(
        "within-rpm",
        &[
            key("sk-rpm-shared", &rpm(RPM)),
            key("sk-daily-shared", &daily(BUDGET)),
        ],
    );
    let routers = Plan::new("shared-rpm", auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);

    // Hammer for ten rounds (2 s): long enough for the routers to hand out the whole minute
    // through their per-round shares, short enough that refill stays small.
    let started = Instant::now();
    let tallies = hammer(&routers, "sk-rpm-shared", 3, after_rounds(&routers, 10));
    let elapsed = started.elapsed();
    let admitted: usize = tallies.iter().map(|t| t.admitted).sum();
    let per_router: Vec<usize> = tallies.iter().map(|t| t.admitted).collect();
    refused_only_by(&tallies, "rate_limit_exceeded");
    // The bound (seed, "What is shared": requests per minute hold "within one sync interval of
    // usage"). A router admits only while its bucket has room, and its bucket holds the limit,
    // plus its refill, minus everything it admitted and everything the others published that it
    // has read. Take the router whose last admission came last: at that moment the site had
    // admitted at most RPM + refill + what the others admitted that it had not read yet, and the
    // seed bounds that by one sync interval of usage. In one interval the three routers admit at
    // most their round's shares (each at most ceil(RPM / 3), a third of a full bucket) plus one
    // first-of-round request each, which passes even when the share is 0.
    let refilled = refill(RPM, elapsed);
    let one_interval = ROUTERS as u64 * (RPM.div_ceil(ROUTERS as u64) + 1);
    let bound = RPM + refilled + one_interval;
    eprintln!("rpm {RPM}: admitted {admitted} {per_router:?} in {elapsed:?}, bound {bound}");
    assert!(
        admitted as u64 <= bound,
        "admitted {admitted} {per_router:?} in {elapsed:?}: over RPM {RPM} + refill {refilled} + one interval {one_interval}"
    );
    // Three routers enforcing alone would each admit the whole minute.
    assert!(
        (admitted as u64) < ROUTERS as u64 * RPM,
        "admitted {admitted}: as many as {ROUTERS} unshared routers"
    );
    // The shares split the minute; they do not lose it: ten rounds hand all of it out.
    assert!(
        admitted as u64 >= RPM,
        "admitted {admitted} {per_router:?}: the routers never handed out the whole minute"
    );
    // Every router served part of it.
    assert!(per_router.iter().all(|n| *n > 0), "{per_router:?}");

    // The daily budget, spread the same way: hammered for fifteen rounds, far more than it
    // takes to spend it.
    let tallies = hammer(&routers, "sk-daily-shared", 3, after_rounds(&routers, 15));
    refused_only_by(&tallies, "token_limit_exceeded");
    let requests: usize = tallies.iter().map(|t| t.admitted).sum();
    let cost = tallies
        .iter()
        .find_map(|t| t.cost)
        .expect("the daily budget admitted nothing");
    // Once every router has read the others' usage, none admits the key any more.
    for router in &routers {
        wait_rounds(router, 2);
    }
    for router in &routers {
        let refused = post(router, "sk-daily-shared");
        assert_eq!(refused.status, 429, "{}", refused.text());
        assert_eq!(refused.error_code(), "token_limit_exceeded");
    }
    // Usage as the routers counted it: exact prompts and answers, refused answers included (a
    // non-streamed answer that crosses the budget is refused after the engine generated it).
    let used = tokens_used(&routers, "sk-daily-shared");
    // The input estimate a request is admitted on: what the very first admission left.
    let estimate = BUDGET
        - tallies
            .iter()
            .filter_map(|t| t.max_remaining_tokens)
            .max()
            .expect("remaining tokens on success");
    // The bound, as for the rate: the budget plus one sync interval of the site's usage. A share
    // bounds only the input estimates a router admits in one round (ceil(BUDGET / 3), plus the
    // first request of the round); each of those requests then costs its exact prompt and its
    // answer, which no share refuses (seed, "When the store is unreachable": "Output tokens are
    // counted after the response, so they are never refused because of a router's share").
    let requests_per_share = BUDGET.div_ceil(ROUTERS as u64) / estimate + 1;
    let one_interval = ROUTERS as u64 * requests_per_share * cost;
    eprintln!(
        "daily {BUDGET}: used {used}, {requests} requests admitted, each {cost} (estimate \
         {estimate}), bound {}",
        BUDGET + one_interval
    );
    assert!(
        used <= BUDGET + one_interval,
        "used {used} of a daily budget of {BUDGET} ({requests} requests of {cost}): over one \
         interval's usage {one_interval}"
    );
    assert!(used < ROUTERS as u64 * BUDGET, "used {used}");
    // Spent: a router refuses once less than one estimate is left.
    assert!(
        used + estimate > BUDGET,
        "used {used} of {BUDGET}: refused with room for an estimate of {estimate}"
    );
}

#[test]
fn store_stopped_each_router_enforces_its_share() {
    const RPM: u64 = 30;
    let mut valkey = Valkey::primary_with(ValkeyOptions::new().aof());
    let auth = auth_file(
        "store-stopped",
        &[
            key("sk-outage-everywhere", &rpm(RPM)),
            key("sk-outage-on-a", &rpm(RPM)),
        ],
    );
    let routers = Plan::new("shared-outage", auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);

    valkey.kill();
    wait_all(&routers, "hivenet_sync_up", |v| v == 0.0);

    // Keys no router used before the outage: their buckets start full, so each router's share is
    // exactly a third of the limit (a key used before would start from what was left of it, and
    // its third could be smaller).
    let share = RPM / ROUTERS as u64;
    let started = Instant::now();
    let per_router: Vec<usize> = routers
        .iter()
        .map(|router| admitted_of(router, "sk-outage-everywhere", 2 * share as usize))
        .collect();
    // Alone, a router refills a third of the rate too.
    let refilled = refill(RPM, started.elapsed()).div_ceil(ROUTERS as u64);
    for admitted in &per_router {
        assert!(
            (share..=share + refilled).contains(&(*admitted as u64)),
            "per router {per_router:?}, share {share} + refill {refilled}"
        );
    }

    // A key used on router A only, during the outage.
    let used_on_a = share as usize - 2;
    let first_use = Instant::now();
    assert_eq!(
        admitted_of(&routers[0], "sk-outage-on-a", used_on_a),
        used_on_a
    );

    valkey.restart();
    wait_site_up(&routers);
    wait_propagated(&routers[0], &[&routers[1]]);
    let response = post_ok(&routers[1], "sk-outage-on-a");
    let remaining = remaining_requests(&response);
    // Router B's bucket: the limit, minus A's held-back usage less what the bucket refilled since
    // A admitted it (seed, "Store back": not charged again), minus B's own request.
    let unrefilled = RPM - 1 - used_on_a as u64;
    let refilled = refill(RPM, first_use.elapsed());
    assert!(
        remaining >= unrefilled,
        "B has {remaining} left after A's {used_on_a} and its own 1 of {RPM}: charged twice"
    );
    assert!(
        remaining <= unrefilled + refilled,
        "B has {remaining} left: A's {used_on_a} held back during the outage never reached it \
         (refill since explains {refilled})"
    );
    assert!(
        remaining < RPM - 1,
        "B has {remaining} left: A's usage never reached it"
    );
}

#[test]
fn a_restarted_router_counts_nothing_twice() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const BUDGET: u64 = 100_000;
    let valkey = Valkey::primary();
    let auth = auth_file("restart", &[key("sk-daily-restart", &daily(BUDGET))]);
    let mut routers = Plan::new("shared-restart", auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);
    let key = "sk-daily-restart";

    // Every request has the same prompt and answer, so the same cost: the step between two
    // consecutive remaining counts.
    let first = remaining_tokens(&post_ok(&routers[0], key));
    let mut last = remaining_tokens(&post_ok(&routers[0], key));
    assert!(last < first, "{first} then {last}");
    let cost = first - last;

    for stop in [Stop::Terminate, Stop::Kill] {
        if stop == Stop::Kill {
            // A crash loses the round in progress (seed: "within one sync interval of usage"):
            // let the usage be published first, so the count below is exact.
            wait_rounds(&routers[0], 2);
        }
        routers[0].restart_router(stop, &[]);
        wait_site_up(&routers);
        let now = remaining_tokens(&post_ok(&routers[0], key));
        assert_eq!(
            now,
            last - cost,
            "after a restart ({stop:?}) router A shows {now} left; before it {last}, one request \
             costs {cost} (a reset would show {}, not {})",
            first,
            last - cost
        );
        last = now;
    }

    // The other routers see A's usage, and add theirs.
    for index in 1..ROUTERS {
        wait_propagated(&routers[index - 1], &[&routers[index]]);
        let now = remaining_tokens(&post_ok(&routers[index], key));
        assert_eq!(now, last - cost, "router {index}");
        last = now;
    }

    // Every router stops, then all start again: today's totals survive in the store alone.
    wait_propagated(&routers[ROUTERS - 1], &[]);
    for router in &mut routers {
        let status = router.router.terminate();
        assert!(status.success(), "{status:?}");
    }
    // Already stopped: the restart only starts each, all at once (each waits for its agent,
    // which is backing off).
    std::thread::scope(|scope| {
        for router in &mut routers {
            scope.spawn(move || router.restart_router(Stop::Kill, &[]));
        }
    });
    wait_site_up(&routers);
    for index in 0..ROUTERS {
        if index > 0 {
            wait_propagated(&routers[index - 1], &[&routers[index]]);
        }
        let now = remaining_tokens(&post_ok(&routers[index], key));
        assert_eq!(
            now,
            last - cost,
            "router {index} after every router restarted (before: {last}, cost {cost})"
        );
        last = now;
    }
}

/// Issue 33 (the site's simulation, seed 102,286 of its long mode): after the store lost its
/// data, each router writes its totals whole again and says so in its heartbeat
/// (`sync::whole`), and each reads the others' again once they do. Until then it counts them
/// unread (`hivenet_sync_unread_routers`) and would spend nothing of a daily budget in an
/// outage; once every one is read, each router counts the whole site's usage of the day,
/// published before the loss, and admits again.
#[test]
fn after_the_store_lost_its_data_each_router_reads_the_others_totals_whole_again() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const BUDGET: u64 = 100_000;
    const KEY: &str = "sk-daily-loss";
    let mut valkey = Valkey::primary();
    let auth = auth_file("daily-loss", &[key(KEY, &daily(BUDGET))]);
    let routers = Plan::new("daily-loss", auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);
    wait_all(&routers, "hivenet_sync_unread_routers", |v| v == 0.0);
    // Every request has the same prompt and answer, so the same cost.
    let first = remaining_tokens(&post_ok(&routers[0], KEY));
    let mut last = remaining_tokens(&post_ok(&routers[0], KEY));
    let cost = first - last;
    for index in 1..ROUTERS {
        wait_propagated(&routers[index - 1], &[&routers[index]]);
        last = remaining_tokens(&post_ok(&routers[index], KEY));
    }
    wait_propagated(&routers[ROUTERS - 1], &[&routers[0], &routers[1]]);

    lose_the_stores_data(&mut valkey, &routers);
    // Past the round that noticed: the gauge says what the rounds since the loss read.
    for router in &routers {
        wait_rounds(router, 2);
    }
    wait_all(&routers, "hivenet_sync_unread_routers", |v| v == 0.0);
    // Every record says its router's totals are whole in the new epoch, and they are.
    let epoch = valkey.command(&["GET", "hivenet:{default}:epoch"]);
    let records = valkey.hash("hivenet:{default}:routers");
    assert_eq!(records.len(), ROUTERS, "{records:?}");
    for (id, text) in &records {
        let record: serde_json::Value = serde_json::from_str(text).expect("a record");
        assert_eq!(record["whole_in"], epoch.as_str(), "{id}: {text}");
    }
    // Two requests on router 0, one on each other.
    assert_eq!(valkey.daily_tokens("default"), (ROUTERS as u64 + 1) * cost);
    // Each router counts what every router spent before the loss, its own and the others'.
    for (index, router) in routers.iter().enumerate() {
        let now = remaining_tokens(&post_ok(router, KEY));
        assert_eq!(
            now,
            last - cost,
            "router {index} after the loss (before: {last}, cost {cost})"
        );
        last = now;
        wait_propagated(router, &[&routers[(index + 1) % ROUTERS]]);
    }
}

/// Issue 33 (the site's simulation, seeds 34,083, 49,786 and 63,956 of its long mode): after
/// the store lost its data, each router publishes again the rate usage it published within the
/// last minute (`sync::republish`), as copies under the field `c` beside `l`: a router that had
/// read the originals drops them (it counts nothing twice), one that had not would apply them.
/// Before, usage published just before a loss and not read yet was in no other router's view.
#[test]
fn after_the_store_lost_its_data_each_router_publishes_its_rate_usage_again() {
    const KEY: &str = "sk-rate-loss";
    // 60 a minute: a request refills in a second, so what a double count takes shows.
    let mut valkey = Valkey::primary();
    let auth = auth_file("rate-loss", &[key(KEY, &rpm(60))]);
    let routers = Plan::new("rate-loss", auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);
    // Router 0 takes 24 requests, over as many rounds as its shares need: refused, it waits
    // for its next round (a third of what is left each).
    let mut admitted = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while admitted < 24 && Instant::now() < deadline {
        if admitted_of(&routers[0], KEY, 1) == 1 {
            admitted += 1;
        } else {
            wait_rounds(&routers[0], 1);
        }
    }
    assert_eq!(admitted, 24, "router 0 takes 24 of 60 within 30 s");
    wait_propagated(&routers[0], &[&routers[1], &routers[2]]);
    let before = remaining_requests(&post_ok(&routers[1], KEY));
    let lost_at = Instant::now();

    lose_the_stores_data(&mut valkey, &routers);
    wait_propagated(&routers[0], &[&routers[1], &routers[2]]);
    // Router 0's copies are in the new stream, written by the script (beside `l`); router 1
    // served one request, whose copy may be there too.
    let stream = valkey
        .reply(&["XRANGE", "hivenet:{default}:usage", "-", "+"])
        .expect("XRANGE");
    let fields: Vec<String> = stream
        .items()
        .iter()
        .map(|item| {
            let fields = item
                .items()
                .get(1)
                .map(|fields| fields.items())
                .unwrap_or(&[]);
            fields.iter().step_by(2).map(|field| field.text()).collect()
        })
        .collect();
    assert!(
        fields.iter().any(|names| names == "cl"),
        "no copy in the new stream: {fields:?}"
    );
    assert!(
        fields.iter().all(|names| names == "cl" || names == "ul"),
        "{fields:?}"
    );
    // Router 1 had read router 0's 24 requests: their copies take nothing more from its view
    // (counted twice, 24 fewer requests, less a few seconds' refill).
    let after = remaining_requests(&post_ok(&routers[1], KEY));
    let refilled = refill(60, lost_at.elapsed()) + 1;
    assert!(
        after + 1 >= before && after <= before + refilled,
        "router 1 had {before} left before the loss, {after} after ({refilled} refilled at most)"
    );
}

/// Issue 33: a router that crashes while the store does not answer leaves the usage it held
/// back in its `--sync-journal`; its next run publishes it, counted once by the others and in
/// the store's totals. Without the journal it was lost: 45 of 400 seeds of the site's
/// simulation spent up to a router's share of a daily budget more.
#[test]
fn a_router_that_crashes_in_an_outage_leaves_its_usage_in_its_journal() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const KEY: &str = "sk-daily-journal";
    let mut valkey = Valkey::primary_with(ValkeyOptions::new().aof());
    let auth = auth_file("journal", &[key(KEY, &daily(100_000))]);
    let mut plan = Plan::new("shared-journal", auth.clone(), &valkey.addr());
    plan.journals = Some(auth.parent().unwrap().to_owned());
    let mut routers = plan.start_all(2);
    wait_site_up(&routers);
    let first = remaining_tokens(&post_ok(&routers[1], KEY));
    let mut last = remaining_tokens(&post_ok(&routers[1], KEY));
    let cost = first - last;
    wait_propagated(&routers[1], &[&routers[0]]);

    valkey.kill();
    wait_all(&routers, "hivenet_sync_up", |v| v == 0.0);
    const HELD_BACK: u64 = 5;
    for _ in 0..HELD_BACK {
        post_ok(&routers[0], KEY);
    }
    // A round that began after the last request wrote the journal (two writes from now: the
    // first may have taken its usage before): then the crash.
    let writes = routers[0].router_metric("hivenet_sync_journal_writes_total");
    routers[0].wait_metric("hivenet_sync_journal_writes_total", |v| v >= writes + 2.0);
    routers[0].restart_router(Stop::Kill, &[]);

    valkey.restart();
    wait_site_up(&routers);
    wait_propagated(&routers[0], &[&routers[1]]);
    last -= HELD_BACK * cost + cost;
    let now = remaining_tokens(&post_ok(&routers[1], KEY));
    assert_eq!(
        now, last,
        "router 1 shows {now} left: router 0's {HELD_BACK} requests held back before its crash \
         ({cost} tokens each) are missing or counted twice"
    );
    wait_propagated(&routers[1], &[&routers[0]]);
    let now = remaining_tokens(&post_ok(&routers[0], KEY));
    assert_eq!(now, last - cost, "router 0's new run");
    // Published, the journal became a checkpoint of router 0's own totals: no entries.
    routers[0].wait_metric("hivenet_sync_journal_checkpoints_total", |v| v >= 1.0);
    let path = plan.journals.unwrap().join("router-0");
    let bytes = journal::read(&path)
        .expect("the journal reads")
        .expect("a checkpoint is there");
    let checkpoint = journal::Journal::decode(&bytes).expect("the checkpoint decodes");
    assert!(
        checkpoint.entries.is_empty(),
        "the usage held back stays in the journal after it was published"
    );
    assert_eq!(checkpoint.totals.len(), 1, "{checkpoint:?}");
}

#[test]
fn sentinel_failover_is_followed() {
    const RPM: u64 = 60;
    let mut primary = Valkey::primary();
    let replica = Valkey::replica_of(&primary);
    let mut sentinels = Sentinels::start(3, &primary, "hivenet");
    let auth = auth_file(
        "sentinel",
        &[
            key("sk-before-failover", &rpm(RPM)),
            key("sk-after-failover", &rpm(RPM)),
        ],
    );
    let mut plan = Plan::new("shared-sentinel", auth, &sentinels.addrs_joined());
    plan.store
        .extend(["--sync-valkey-sentinel-master".into(), "hivenet".into()]);
    let routers = plan.start_all(ROUTERS);
    wait_site_up(&routers);

    // Usage on A reduces B's remaining: `used` on A, B's own 1, refill since.
    let shared = |key: &str, used: usize| {
        let started = Instant::now();
        assert_eq!(admitted_of(&routers[0], key, used), used);
        wait_propagated(&routers[0], &[&routers[1]]);
        let remaining = remaining_requests(&post_ok(&routers[1], key));
        let expected = RPM - 1 - used as u64;
        let refilled = refill(RPM, started.elapsed());
        assert!(
            (expected..=expected + refilled).contains(&remaining),
            "{key}: B has {remaining} left after A's {used}; expected {expected} (+ refill {refilled})"
        );
        assert!(remaining < RPM - 1, "{key}: A's usage never reached B");
    };
    shared("sk-before-failover", 10);

    let errors_before: Vec<f64> = routers
        .iter()
        .map(|r| r.router_metric("hivenet_sync_errors_total"))
        .collect();
    let old = primary.addr();
    primary.kill();
    let promoted = sentinels.wait_failover_from(&old);
    assert_eq!(promoted, replica.addr());
    // Every router noticed the primary was gone, then found the new one through the Sentinels.
    for (router, before) in routers.iter().zip(&errors_before) {
        router.wait_metric("hivenet_sync_errors_total", |v| v > *before);
    }
    wait_site_up(&routers);
    shared("sk-after-failover", 10);
}

#[test]
fn an_agent_given_one_router_reaches_all_three() {
    let valkey = Valkey::primary();
    let auth = auth_file("discovery", &[]);
    let mut plan = Plan::new("shared-discovery", auth, &valkey.addr());
    plan.with_agent = false;
    plan.extra = [
        "--advertise-grpc-addr",
        "{grpc}",
        "--heartbeat-interval",
        "1s",
    ]
    .map(String::from)
    .to_vec();
    // Router A has a sim: the one agent, given router A only, serves it.
    let mut routers: Vec<Site> = std::thread::scope(|scope| {
        let plan = &plan;
        let a = scope.spawn(move || {
            Site::start(
                "shared-discovery-0",
                plan.options(0)
                    .sim(&["--models", "sim-model", "--output-tokens", OUTPUT_TOKENS]),
            )
        });
        let others: Vec<_> = (1..ROUTERS)
            .map(|index| scope.spawn(move || plan.start(index)))
            .collect();
        std::iter::once(a)
            .chain(others)
            .map(|s| s.join().unwrap())
            .collect()
    });
    wait_site_up(&routers);
    let only_a = routers[0].grpc.to_string();
    routers[0].spawn_agent_with_env(0, &["--routers", &only_a], &[]);
    let reaches = |router: &Site| {
        router.wait_metric("hivenet_shard_tunnels_open", |v| v >= 1.0);
        router.wait_models(&["sim-model"]);
        router.assert_chat_ok("sim-model");
    };
    for router in &routers {
        reaches(router);
    }
    // Router A, listed under its advertised address too, is recognized: one session, not two.
    assert_eq!(routers[0].router_metric("hivenet_shard_tunnels_open"), 1.0);

    // A fourth router joins the site later: the agent finds it through the others' lists, at
    // its next heartbeat (after the others' next round has read the newcomer's heartbeat).
    plan.name = "shared-discovery-late";
    let fourth = plan.start(ROUTERS);
    fourth.wait_metric("hivenet_sync_up", |v| v == 1.0);
    let listed = Instant::now();
    fourth.wait_metric("hivenet_shard_tunnels_open", |v| v >= 1.0);
    let reached = listed.elapsed();
    eprintln!("the agent reached the fourth router {reached:?} after the store listed it");
    // "Within one heartbeat" (seed, "Let agents find every router"), with room for a loaded
    // 2-core box: the others' round, one heartbeat, the dial and the tunnel.
    assert!(
        reached <= HEARTBEATS_TO_REACH * HEARTBEAT,
        "the agent reached the fourth router {reached:?} after the store listed it"
    );
    reaches(&fourth);
    routers.push(fourth);
    wait_site_up(&routers);
    assert_eq!(routers[0].router_metric("hivenet_shard_tunnels_open"), 1.0);
}

#[test]
fn a_key_with_a_daily_budget_is_refused_while_totals_cannot_be_read() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const RPM: u64 = 1_200;
    let mut valkey = Valkey::primary();
    valkey.kill();
    let booted = Instant::now();
    let auth = auth_file(
        "totals-unread",
        &[
            key("sk-unread-daily", &daily(100_000)),
            key("sk-unread-rpm", &rpm(RPM)),
        ],
    );
    let router = Plan::new("shared-unread", auth, &valkey.addr()).start(0);
    assert_eq!(router.router_metric("hivenet_sync_up"), 0.0);

    let refused = post(&router, "sk-unread-daily");
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "token_limit_exceeded");

    // Without a daily budget the key works, at this router's share of the refill (a third,
    // with --sync-min-routers 3) since it started: it does not know what the site left of the
    // burst, so it takes none of it (`sync::simulation`, seed 72).
    router.wait_for("the key without a daily budget admitted once", || {
        (admitted_of(&router, "sk-unread-rpm", 1) == 1).then_some(())
    });
    let admitted = 1 + admitted_of(&router, "sk-unread-rpm", 100) as u64;
    let refilled = refill(RPM, booted.elapsed()).div_ceil(ROUTERS as u64);
    assert!(
        admitted <= refilled && admitted < RPM / ROUTERS as u64,
        "admitted {admitted}; its share of the refill since it started: {refilled}, of the burst \
         (none): {}",
        RPM / ROUTERS as u64
    );

    valkey.restart();
    router.wait_metric("hivenet_sync_up", |v| v == 1.0);
    post_ok(&router, "sk-unread-daily");
}

/// Issue 37, finding 8: a router kept a full quota holder for every key of the site, served
/// there or not. Keys only another router serves now cost no holder: their usage waits compact
/// (`hivenet_shard_quota_holders{kind="remote_only"}`), and a request here later finds the key
/// already charged. Before the fix, the second router held an owner holder per key.
#[test]
fn keys_served_elsewhere_cost_no_holder_and_are_charged_when_served_here() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const KEYS: usize = 100;
    const BUDGET: u64 = 1_000_000;
    let raws: Vec<&'static str> = (0..KEYS)
        .map(|index| &*Box::leak(format!("sk-remote-{index:03}").into_boxed_str()))
        .collect();
    let quota = format!("{}\n        {}", rpm(600), daily(BUDGET));
    let mut keys: Vec<Key> = raws.iter().map(|raw| key(raw, &quota)).collect();
    keys.push(key("sk-remote-small", &daily(30)));
    let valkey = Valkey::primary();
    let routers = Plan::new(
        "remote-only",
        auth_file("remote-only", &keys),
        &valkey.addr(),
    )
    .start_all(ROUTERS);
    wait_site_up(&routers);
    for raw in &raws {
        post_ok(&routers[0], raw);
    }
    // Router 0 spends the small budget of another key, a round at a time (each router may
    // admit its share of what is left per round).
    let small = "sk-remote-small";
    loop {
        let response = post(&routers[0], small);
        if response.status == 429 {
            assert_eq!(response.error_code(), "token_limit_exceeded");
            break;
        }
        assert_eq!(response.status, 200, "{}", response.text());
        wait_rounds(&routers[0], 2);
    }
    wait_propagated(&routers[0], &[&routers[1]]);
    let holders = |router: &Site, kind: &str| {
        metric_sum(
            &router.router_metrics(),
            "hivenet_shard_quota_holders",
            &[("kind", kind)],
        )
    };
    assert_eq!(holders(&routers[0], "owner"), (KEYS + 1) as f64);
    // What a round writes, everything included, is more than its usage entries.
    let written = routers[0].router_metric("hivenet_sync_store_written_bytes_total");
    let published = routers[0].router_metric("hivenet_sync_published_bytes_total");
    assert!(
        written > published && published > 0.0,
        "{written} {published}"
    );
    assert_eq!(holders(&routers[1], "owner"), 0.0);
    // The small key's daily usage waits compact too, unless router 1 read today's totals since
    // it arrived (it does for five rounds after a router joins or comes back): then it waits
    // in the totals read, for the holder, with no remote-only entry (`Quotas::restore`). The
    // rate keys' usage waits whatever was read. Counted exactly, CI saw 100 once.
    let remote_only = holders(&routers[1], "remote_only");
    assert!(
        remote_only == KEYS as f64 || remote_only == (KEYS + 1) as f64,
        "{remote_only}"
    );
    // Served here, the key finds its budget spent on router 0.
    let refused = post(&routers[1], small);
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "token_limit_exceeded");
    assert_eq!(holders(&routers[1], "owner"), 1.0);
    assert_eq!(holders(&routers[1], "remote_only"), KEYS as f64);
    // A key with room left is served, with a holder of its own.
    post_ok(&routers[1], raws[1]);
    assert_eq!(holders(&routers[1], "owner"), 2.0);
}

/// Issue 33, the daily budget with the store down (seed: "Daily budgets spend at most what was
/// left at the outage's start divided by the routers"). Three routers, 900 tokens a day, one
/// request on each while the store answers; then the store is gone, and router 0 alone is sent
/// requests until it refuses. What it spends, input and output, stays within its third of what
/// was left (and one request past it). Before the fix only input estimates counted against its
/// third, and it spent far more (the issue measured 798 of 900).
#[test]
fn cut_off_a_router_spends_its_third_of_the_daily_budget_left() {
    cut_off_router_spends_its_third(Lateness::OnTime);
}

/// Router 2 is late at the round of router 0's request (stopped for a moment, as on a loaded
/// machine), on time at every round after it and at the outage's start. Router 0's third is of
/// what was left: it held router 2's part back from its last admission's round through the
/// outage, minutes later, and spent 187 tokens of its 289 (CI saw it twice).
#[test]
fn a_router_late_at_the_keys_last_admission_and_on_time_since_costs_nothing_in_an_outage() {
    cut_off_router_spends_its_third(Lateness::AtRouter0sRequest);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lateness {
    OnTime,
    AtRouter0sRequest,
}

fn cut_off_router_spends_its_third(lateness: Lateness) {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const BUDGET: u64 = 900;
    const KEY: &str = "sk-daily-outage";
    let mut valkey = Valkey::primary();
    let name = match lateness {
        Lateness::OnTime => "daily-outage",
        Lateness::AtRouter0sRequest => "daily-outage-late",
    };
    let auth = auth_file(name, &[key(KEY, &daily(BUDGET))]);
    let routers = Plan::new(name, auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);
    // Past a new run's first rounds, which cannot tell a silent router from a live one: a run
    // that loses the store then leaves the others their part of the whole budget.
    for router in &routers {
        wait_rounds(router, 5);
    }
    let cost = |response: &Response| response.json()["usage"]["total_tokens"].as_u64().unwrap();
    let mut before = 0;
    if lateness == Lateness::AtRouter0sRequest {
        routers[2].router.signal("STOP");
        routers[0].wait_metric("hivenet_sync_late_routers", |late| late == 1.0);
    }
    before += cost(&post_ok(&routers[0], KEY));
    routers[2].router.signal("CONT");
    for router in &routers[1..] {
        before += cost(&post_ok(router, KEY));
    }
    for index in 0..ROUTERS {
        wait_propagated(&routers[index], &[&routers[(index + 1) % ROUTERS]]);
    }
    // A router late at the last round before the outage (its record unchanged for an interval,
    // as on a loaded machine) keeps its part of the most that was left over the last rounds, the
    // whole 900 before the three requests included, and router 0's third is of the rest
    // (`limits::daily`). The store goes at a round where router 0 counts none late, most often;
    // a round can still slip in before it goes, and the gauge says what the outage holds back.
    routers[0].wait_metric("hivenet_sync_late_routers", |late| late == 0.0);
    assert_eq!(
        routers[0].router_metric("hivenet_sync_unlisted_routers"),
        0.0,
        "every router of the site is listed"
    );
    valkey.kill();
    wait_all(&routers, "hivenet_sync_up", |v| v == 0.0);

    let mut spent = 0;
    let mut largest = 0;
    loop {
        let response = post(&routers[0], KEY);
        if response.status == 429 {
            assert_eq!(response.error_code(), "token_limit_exceeded");
            break;
        }
        assert_eq!(response.status, 200, "{}", response.text());
        let tokens = cost(&response);
        spent += tokens;
        largest = largest.max(tokens);
        assert!(spent < BUDGET, "router 0 spent {spent}, the whole budget");
    }
    let left = BUDGET - before;
    let third = left / ROUTERS as u64;
    let late = routers[0].router_metric("hivenet_sync_late_routers") as u64;
    let held_for_late = (BUDGET * late).div_ceil(ROUTERS as u64);
    let least = left.saturating_sub(held_for_late) / ROUTERS as u64;
    eprintln!(
        "cut off, router 0 spent {spent} tokens; its third of what was left is {third}, \
         {late} late router(s) at the last round"
    );
    assert!(
        spent <= third + largest,
        "router 0 spent {spent} tokens alone; its third of the {left} left is {third}"
    );
    assert!(
        spent + largest >= least,
        "router 0 spent only {spent} of its {least} ({late} late)"
    );
}

/// Issue 33, sustained load: three routers (sync every 200 ms) share a key of 1,200 requests a
/// minute, each sent requests back to back. Over 50 rounds after the burst is spent the site
/// admits the rate, not more, and every router serves its part. Before the fix the others' usage
/// was credited with refill the bucket had kept anyway: the issue measured 490 where 400 were
/// allowed, split 392 / 98 / 0.
#[test]
fn three_routers_under_sustained_load_admit_the_rate_and_each_its_part() {
    const RPM: u64 = 1200;
    const KEY: &str = "sk-sustained";
    let valkey = Valkey::primary();
    let auth = auth_file("sustained", &[key(KEY, &rpm(RPM))]);
    let mut plan = Plan::new("sustained", auth, &valkey.addr());
    // A burst of one second of the rate: spent at once, so the window measures the rate.
    plan.env.push(("HIVENET_ROUTER_RPM_BURST_SECONDS", "1"));
    let routers = plan.start_all(ROUTERS);
    wait_site_up(&routers);
    hammer(&routers, KEY, 1, after_rounds(&routers, 5));
    let started = Instant::now();
    let tallies = hammer(&routers, KEY, 1, after_rounds(&routers, 50));
    let elapsed = started.elapsed();
    let per_router: Vec<usize> = tallies.iter().map(|t| t.admitted).collect();
    let refused: Vec<usize> = tallies.iter().map(|t| t.refused.len()).collect();
    let admitted = per_router.iter().sum::<usize>() as u64;
    let allowed = refill(RPM, elapsed);
    eprintln!(
        "sustained: admitted {admitted} {per_router:?} (refused {refused:?}) in {elapsed:?}; the rate allows {allowed}"
    );
    refused_only_by(&tallies, "rate_limit_exceeded");
    for tally in &tallies {
        assert!(
            !tally.refused.is_empty(),
            "the load never reached the limit"
        );
    }
    // The rate over the window, the burst it may have refilled between the two hammers, and
    // each router's first request of the window's first round.
    let bound = allowed + RPM / 60 + ROUTERS as u64;
    assert!(
        admitted <= bound,
        "admitted {admitted} {per_router:?} in {elapsed:?} where the rate allows {allowed} (bound {bound})"
    );
    let fair = allowed / ROUTERS as u64;
    for (router, count) in per_router.iter().enumerate() {
        assert!(
            *count as u64 >= fair / 2,
            "router {router} admitted {count} of {admitted} {per_router:?}: starved (fair share {fair})"
        );
    }
}

/// Issue 33, a daily budget at an operator's size under sustained load: three routers (sync
/// every 200 ms) share a key of 60,000 tokens a day, each hammered by two clients until every
/// router has refused it for ten rounds. The site spends the budget, not more than one sync
/// interval of its own usage past it (seed, "What is shared": daily totals hold "within one
/// sync interval of usage"), every refusal is the daily budget's, and each router served at
/// least half its part: small budgets (600 tokens, above) end within a round or two and show
/// neither the overshoot nor the split.
#[test]
fn three_routers_under_sustained_load_spend_the_daily_budget_and_each_its_part() {
    common::clear_of_midnight(DAILY_TEST_SPAN);
    const BUDGET: u64 = 60_000;
    const KEY: &str = "sk-daily-sustained";
    let valkey = Valkey::primary();
    let auth = auth_file("daily-sustained", &[key(KEY, &daily(BUDGET))]);
    let routers = Plan::new("daily-sustained", auth, &valkey.addr()).start_all(ROUTERS);
    wait_site_up(&routers);
    for router in &routers {
        wait_rounds(router, 5);
    }
    let started = Instant::now();
    let mut exhausted_rounds: Option<Vec<f64>> = None;
    let tallies = hammer(&routers, KEY, 2, || {
        // Until the routers' counts reach the budget, then ten more rounds of every router.
        // A router's counters exist from its first request of the key: none before.
        let used: f64 = routers
            .iter()
            .map(|router| {
                let metrics = router.router_metrics();
                let labels = [("tenant_id", KEY)];
                [
                    "hivenet_tenant_input_tokens_total",
                    "hivenet_tenant_output_tokens_total",
                ]
                .iter()
                .filter_map(|name| metric_sum_present(&metrics, name, &labels))
                .sum::<f64>()
            })
            .sum();
        let used = used as u64;
        if used < BUDGET && exhausted_rounds.is_none() {
            return false;
        }
        let from = exhausted_rounds.get_or_insert_with(|| routers.iter().map(rounds).collect());
        routers
            .iter()
            .zip(from.iter())
            .all(|(router, from)| rounds(router) >= from + 10.0)
    });
    let elapsed = started.elapsed();
    refused_only_by(&tallies, "token_limit_exceeded");
    let per_router: Vec<usize> = tallies.iter().map(|t| t.admitted).collect();
    let requests: usize = per_router.iter().sum();
    let cost = tallies
        .iter()
        .find_map(|t| t.cost)
        .expect("the daily budget admitted nothing");
    for router in &routers {
        wait_rounds(router, 2);
    }
    let used = tokens_used(&routers, KEY);
    // One interval of the site's usage at the pace it was spent, and each router's first
    // request of the round the budget ran out in.
    let interval = Duration::from_millis(200);
    let per_interval = (requests as f64 * cost as f64 * interval.as_secs_f64()
        / elapsed.as_secs_f64())
    .ceil() as u64;
    let bound = BUDGET + per_interval + ROUTERS as u64 * cost;
    eprintln!(
        "daily {BUDGET} under sustained load: used {used}, {requests} requests {per_router:?} of \
         {cost} tokens in {elapsed:?}; one interval's usage {per_interval}, bound {bound}"
    );
    assert!(
        used <= bound,
        "used {used} of {BUDGET} ({requests} requests {per_router:?}): past one interval's usage \
         {per_interval}"
    );
    assert!(
        used + cost > BUDGET,
        "used {used} of {BUDGET}: refused with room left"
    );
    let fair = requests / ROUTERS;
    for (router, count) in per_router.iter().enumerate() {
        assert!(
            *count >= fair / 2,
            "router {router} served {count} of {requests} {per_router:?}: starved (fair {fair})"
        );
    }
}

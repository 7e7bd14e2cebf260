//! Proves that a router driven far past its agents' capacity (ten times the slots, hundreds of
//! idle connections, bodies that trickle in) keeps answering at once with 429/503 in the
//! documented envelope, keeps its resident memory under a stated cap, and still serves a
//! well-behaved client; and that partial bodies cannot take its memory past that cap.
//!
//! Timings here are liveness bounds, not performance figures: a refusal that takes longer than
//! [`ANSWER_WITHIN`] means the router stopped answering, not that it got slower.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Conn, Options, Site, chat, get_request, post_request, try_request};
use serde_json::Value;

/// Agent slots for the overloaded model: two agents of capacity 2, each in front of its own sim
/// that generates two answers at once.
const SLOTS: usize = 4;
/// Clients hammering the overloaded model at once: ten times its slots.
const HOSTILE_CLIENTS: usize = 10 * SLOTS;
/// Requests the gated model's policy admits at once (`max_inflight`, one healthy replica), and the
/// clients hammering it: ten times that. Over the gate a request parks for the admission park
/// timeout (250 ms by default), then gets 429.
const GATED_INFLIGHT: usize = 1;
const GATED_CLIENTS: usize = 10 * GATED_INFLIGHT;
/// How long the hammering lasts, and the most requests one hostile client sends in that time:
/// the test is bounded in time and in count.
const HAMMER_FOR: Duration = Duration::from_secs(8);
const HOSTILE_REQUESTS_MAX: usize = 100;
/// A hostile client's pause after each answer: keeps the request rate (and the test's own CPU)
/// bounded on a shared 2-core machine while ten clients still wait for every freed slot.
const HOSTILE_PAUSE: Duration = Duration::from_millis(50);
/// Connections that connect and never send a byte, held for the whole run.
const IDLE_CONNECTIONS: usize = 300;
/// Connections that send a request head with a `Content-Length` and then trickle the body.
const SLOW_BODIES: usize = 50;
const SLOW_BODY_BYTES: usize = 64 * 1024;
const TRICKLE_BYTES: usize = 16;
const TRICKLE_EVERY: Duration = Duration::from_millis(200);
/// Liveness bound on a refusal and on each of the well-behaved client's requests (whose model has
/// room, and whose sim answers at once).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The stated memory caps on the router's resident set (VmRSS), sampled every 50 ms. An idle
/// two-shard router sits near 33 MiB (release build; 46 MiB debug); the overload run (hundreds of
/// connections, thousands of refusals) peaks at 48-52 MiB (64 MiB debug).
/// The cap leaves room for that, and none for growth with the number of requests or connections.
const RSS_CAP_OVERLOAD_KIB: u64 = 128 * 1024;
/// With partial bodies held open the router buffers what `--max-buffered-body-bytes` (64 MiB per
/// shard by default) lets it: two shards' budgets over the idle router fit under it, bodies
/// buffered without a bound (384 MiB are sent) do not. Before the bound: 617 MiB.
const RSS_CAP_PARTIAL_BODIES_KIB: u64 = 256 * 1024;
/// Partial bodies of the memory test: each declares [`PARTIAL_BODY_DECLARED`] bytes and sends
/// [`PARTIAL_BODY_SENT`] of them at once, [`PARTIAL_BODIES`] × [`PARTIAL_BODY_SENT`] = 384 MiB in
/// all, half again over [`RSS_CAP_PARTIAL_BODIES_KIB`].
const PARTIAL_BODIES: usize = 96;
const PARTIAL_BODY_DECLARED: usize = 8 * 1024 * 1024;
const PARTIAL_BODY_SENT: usize = 4 * 1024 * 1024;
/// Longest the test spends sending the partial bodies (a router that stops reading them makes a
/// write block).
const FILL_WITHIN: Duration = Duration::from_secs(10);
/// How long the partial bodies stay open (trickling a byte now and then) once sent.
const PARTIAL_HOLD: Duration = Duration::from_secs(3);
/// Error codes a refusal under overload may carry (docs/request-path.md, phases 5b and 6).
const OVERLOAD_CODES: [&str; 4] = [
    "no_capacity",
    "queue_full",
    "concurrency_limit_exceeded",
    "rate_limit_exceeded",
];
const MODEL: &str = "sim-model";
const GATED_MODEL: &str = "gated-model";
const POLITE_MODEL: &str = "polite-model";

/// Sims 0 and 1 serve `sim-model` slowly (20 tokens 100 ms apart: two seconds an answer, two at
/// once) behind agents of capacity 2; sim 2 serves `polite-model` at once behind an agent of
/// capacity 8; sim 3 serves `gated-model` as slowly as sims 0 and 1, behind an agent of capacity
/// 2 and a policy that admits [`GATED_INFLIGHT`] request at a time. The router queues at most 2
/// requests per model.
fn overload_site(name: &str) -> Site {
    let slow = |model| {
        [
            "--models",
            model,
            "--max-concurrency",
            "2",
            "--max-waiting",
            "4",
            "--itl",
            "100ms",
            "--output-tokens",
            "20",
        ]
    };
    let policies = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-policies-{}", std::process::id()));
    std::fs::create_dir_all(&policies).expect("create the policy directory");
    std::fs::write(
        policies.join("gated.yaml"),
        format!(
            "models:\n  - {GATED_MODEL}\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: {GATED_INFLIGHT}\n"
        ),
    )
    .expect("write the gated model's policy");
    Site::start(
        name,
        Options::new()
            .sim(&slow(MODEL))
            .sim(&slow(MODEL))
            .sim(&["--models", POLITE_MODEL])
            .sim(&slow(GATED_MODEL))
            .router_args(&[
                "--queue-depth",
                "2",
                "--request-timeout",
                "20s",
                "--policy-model-dir",
                &policies.display().to_string(),
            ])
            .agent(0, &["--capacity", "2"])
            .agent(1, &["--capacity", "2"])
            .agent(2, &["--capacity", "8"])
            .agent(3, &["--capacity", "2"])
            // `assert_router_settled` checks nothing was reaped, which needs a reaper that runs
            // within the test. The gated model's reservations are its only ones: one at a time
            // (`max_inflight` 1, an agent with 2 slots, so never queued), each a 2 s answer whose
            // stream (if streamed) refreshes every 1.6 s; 10 s spares them on a loaded machine and
            // reaps a lost release well within the 30 s the settle check waits.
            .reaper("1s", "10s")
            .models(&[MODEL, POLITE_MODEL, GATED_MODEL]),
    )
}

// ---------------------------------------------------------------------------------------------
// Memory

/// The resident set of process `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Samples the router's RSS every 50 ms until `stop`, keeping the largest value.
fn sample_rss(pid: u32, stop: &AtomicBool, peak_kib: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        peak_kib.fetch_max(rss_kib(pid), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
    }
    peak_kib.fetch_max(rss_kib(pid), Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Clients

/// What one hostile request got.
enum Answer {
    /// 200 with a complete answer (a stream ending in `[DONE]`).
    Served,
    /// 429 or 503 with the documented envelope and an overload code, after `took`.
    Refused {
        status: u16,
        code: String,
        took: Duration,
    },
}

/// Checks the documented envelope `{"error":{"code","message","source"}}`; returns the code.
fn envelope_code(body: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(body);
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| format!("error body is not JSON ({e}): {text}"))?;
    let error = &value["error"];
    let code = error["code"].as_str();
    let message = error["message"].as_str();
    let source = error["source"].as_str();
    match (code, message, source) {
        (Some(code), Some(_), Some("router" | "backend")) => Ok(code.to_string()),
        _ => Err(format!("not the documented error envelope: {text}")),
    }
}

/// One request for `model` on a fresh connection, checked: a complete success, or a quick refusal
/// in the documented envelope. `Err` names what was wrong.
fn one_request(addr: SocketAddr, model: &str, stream: bool) -> Result<Answer, String> {
    let started = Instant::now();
    let raw = post_request("/v1/chat/completions", &chat(model, stream).to_string());
    let response = try_request(addr, &raw).map_err(|e| {
        format!(
            "no answer ({} stream={stream}) after {:?}: {e}",
            model,
            started.elapsed()
        )
    })?;
    let took = started.elapsed();
    match response.status {
        200 if stream => {
            let body = response.text();
            if body.ends_with("data: [DONE]\n\n") && !body.contains("\"error\"") {
                Ok(Answer::Served)
            } else {
                Err(format!("stream did not end with [DONE]: {body}"))
            }
        }
        200 => {
            let value: Value = serde_json::from_slice(&response.body)
                .map_err(|e| format!("200 body is not JSON ({e}): {}", response.text()))?;
            if value["object"] == "chat.completion" {
                Ok(Answer::Served)
            } else {
                Err(format!("200 without a completion: {}", response.text()))
            }
        }
        429 | 503 => {
            let code = envelope_code(&response.body)?;
            if !OVERLOAD_CODES.contains(&code.as_str()) {
                return Err(format!("{} with code {code}", response.status));
            }
            if took > ANSWER_WITHIN {
                return Err(format!(
                    "{} {code} took {took:?} (liveness bound {ANSWER_WITHIN:?})",
                    response.status
                ));
            }
            Ok(Answer::Refused {
                status: response.status,
                code,
                took,
            })
        }
        status => Err(format!("unexpected {status}: {}", response.text())),
    }
}

#[derive(Default)]
struct HostileTally {
    served: usize,
    refused: usize,
    /// Refusals by status and code.
    refused_as: BTreeMap<(u16, String), usize>,
    slowest_refusal: Duration,
    problems: Vec<String>,
}

/// A client that sends requests for `model` back to back (alternating streamed and not) until
/// `until`, pausing [`HOSTILE_PAUSE`] after each answer.
fn hostile_client(addr: SocketAddr, model: &str, index: usize, until: Instant) -> HostileTally {
    let mut tally = HostileTally::default();
    for n in 0..HOSTILE_REQUESTS_MAX {
        if Instant::now() >= until {
            break;
        }
        match one_request(addr, model, (index + n).is_multiple_of(2)) {
            Ok(Answer::Served) => tally.served += 1,
            Ok(Answer::Refused { status, code, took }) => {
                tally.refused += 1;
                *tally.refused_as.entry((status, code)).or_default() += 1;
                tally.slowest_refusal = tally.slowest_refusal.max(took);
            }
            Err(problem) => tally.problems.push(problem),
        }
        std::thread::sleep(HOSTILE_PAUSE);
    }
    tally
}

/// A well-behaved client: one request at a time for a model with room, plus `/health` and
/// `/v1/models`, until `until`. Every one must succeed within [`ANSWER_WITHIN`]. Returns how many
/// succeeded and what went wrong.
fn polite_client(addr: SocketAddr, until: Instant) -> (usize, Vec<String>) {
    let mut succeeded = 0;
    let mut problems = Vec::new();
    let mut n = 0usize;
    while Instant::now() < until {
        let started = Instant::now();
        let outcome = match n % 4 {
            0 | 1 => match one_request(addr, POLITE_MODEL, n % 4 == 1) {
                Ok(Answer::Served) => Ok(()),
                Ok(Answer::Refused { .. }) => Err("polite request refused".to_string()),
                Err(problem) => Err(problem),
            },
            2 => get_ok(addr, "/health"),
            _ => get_ok(addr, "/v1/models"),
        };
        let took = started.elapsed();
        match outcome {
            Ok(()) if took <= ANSWER_WITHIN => succeeded += 1,
            Ok(()) => problems.push(format!("polite request {n} took {took:?}")),
            Err(problem) => problems.push(format!("polite request {n}: {problem}")),
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    (succeeded, problems)
}

fn get_ok(addr: SocketAddr, path: &str) -> Result<(), String> {
    let response = try_request(addr, &get_request(path)).map_err(|e| format!("GET {path}: {e}"))?;
    if response.status == 200 {
        Ok(())
    } else {
        Err(format!(
            "GET {path}: {} {}",
            response.status,
            response.text()
        ))
    }
}

/// Opens `count` connections that send nothing.
fn idle_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|i| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("idle connection {i}: {e}"))
        })
        .collect()
}

/// Opens `count` connections that each send a request head declaring `declared` body bytes, then
/// `first` bytes of that body at once. A router that refuses the bodies may close or stop reading
/// (that is its right): the sending is bounded by [`FILL_WITHIN`] in all, and by a second on any
/// one connection. Returns the connections and the body bytes the kernel took from the test.
fn partial_bodies(
    addr: SocketAddr,
    count: usize,
    declared: usize,
    first: usize,
) -> (Vec<Conn>, usize) {
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    );
    let filler = vec![b' '; first];
    let fill_until = Instant::now() + FILL_WITHIN;
    let mut sent_bytes = 0;
    let conns = (0..count)
        .map(|i| {
            let mut conn = Conn::connect(addr);
            let left = fill_until.saturating_duration_since(Instant::now());
            conn.stream
                .set_write_timeout(Some(
                    left.clamp(Duration::from_millis(10), Duration::from_secs(1)),
                ))
                .unwrap();
            conn.send(head.as_bytes())
                .unwrap_or_else(|e| panic!("head of slow body {i}: {e}"));
            let mut sent = 0;
            while sent < filler.len() {
                match conn.stream.write(&filler[sent..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sent += n,
                }
            }
            sent_bytes += sent;
            conn
        })
        .collect();
    (conns, sent_bytes)
}

/// Sends [`TRICKLE_BYTES`] on every connection each [`TRICKLE_EVERY`] until `until`; a
/// connection the router has closed, or no longer reads from, is left alone.
fn trickle(conns: &mut [Conn], until: Instant) {
    for conn in conns.iter_mut() {
        let _ = conn
            .stream
            .set_write_timeout(Some(Duration::from_millis(50)));
    }
    let bytes = [b' '; TRICKLE_BYTES];
    let mut open = vec![true; conns.len()];
    while Instant::now() < until {
        for (conn, open) in conns.iter_mut().zip(open.iter_mut()) {
            if *open && conn.stream.write_all(&bytes).is_err() {
                *open = false;
            }
        }
        std::thread::sleep(TRICKLE_EVERY);
    }
}

// ---------------------------------------------------------------------------------------------
// After a run

/// Sum of every sample of `name` carrying `labels`, or `None` when the router exposes no such
/// series (a missing gauge is a failure, not a zero).
fn present_sum(text: &str, name: &str, labels: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
        if series_name == name && series_labels.contains(labels) {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(f64::NAN);
        }
    }
    found
}

/// Waits until the router's in-flight and queue gauges are back to 0 and its connections are all
/// closed; checks the reaper released nothing, no control queue ran full and no thread panicked.
fn assert_router_settled(site: &Site, gated_model_used: bool) {
    site.wait_for("in-flight, queue and connection gauges back to 0", || {
        let response = try_request(site.metrics, &get_request("/metrics")).ok()?;
        let text = String::from_utf8_lossy(&response.body);
        let zero = |name: &str, labels: &str| present_sum(&text, name, labels) == Some(0.0);
        let gated = format!("model=\"{GATED_MODEL}\"");
        (zero("hivenet_shard_in_flight", "")
            && zero("hivenet_queue_depth", &format!("model=\"{MODEL}\""))
            && zero("hivenet_queue_depth", &gated)
            // The gated model's admission series exist once it has had a request.
            && (!gated_model_used
                || (zero("hivenet_admission_inflight_requests", &gated)
                    && zero("hivenet_admission_occupancy_tokens", &gated)))
            && zero("hivenet_shard_connections_open", ""))
        .then_some(())
    });
    // Whatever a reaper could release by now, it has (see `overload_site`'s reaper).
    site.wait_reaper_pass();
    let text = site.router_metrics();
    assert_eq!(
        present_sum(&text, "hivenet_admission_reaped_total", ""),
        Some(0.0),
        "{text}"
    );
    // Client overload never reaches the queues between the control core and the shards.
    assert_eq!(
        present_sum(&text, "hivenet_control_queue_full_total", ""),
        Some(0.0),
        "{text}"
    );
    let log = site.router.log_text();
    assert!(!log.contains("panicked"), "{}", site.router.log_tail());
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn overload_is_refused_at_once_while_a_well_behaved_client_is_served() {
    let site = overload_site("overload");
    let router_pid = site.router.pid().expect("router pid");
    let rss_idle_kib = rss_kib(router_pid);

    // The load that only costs the router memory and connections: idle sockets and bodies that
    // trickle in, all accepted before the hammering starts.
    let idle = idle_connections(site.http, IDLE_CONNECTIONS);
    let (mut slow, _) = partial_bodies(site.http, SLOW_BODIES, SLOW_BODY_BYTES, TRICKLE_BYTES);
    site.wait_metric("hivenet_shard_connections_open", |v| {
        v >= (IDLE_CONNECTIONS + SLOW_BODIES) as f64
    });

    let stop_sampling = AtomicBool::new(false);
    let rss_peak_kib = AtomicU64::new(0);
    let until = Instant::now() + HAMMER_FOR;
    let (hostile, (polite_ok, polite_problems)) = std::thread::scope(|scope| {
        scope.spawn(|| sample_rss(router_pid, &stop_sampling, &rss_peak_kib));
        let trickler = scope.spawn(|| trickle(&mut slow, until));
        let hostile: Vec<_> = (0..HOSTILE_CLIENTS + GATED_CLIENTS)
            .map(|index| {
                let model = if index < HOSTILE_CLIENTS {
                    MODEL
                } else {
                    GATED_MODEL
                };
                scope.spawn(move || hostile_client(site.http, model, index, until))
            })
            .collect();
        let polite = scope.spawn(|| polite_client(site.http, until));
        let hostile: Vec<HostileTally> = hostile.into_iter().map(|h| h.join().unwrap()).collect();
        let polite = polite.join().unwrap();
        trickler.join().unwrap();
        stop_sampling.store(true, Ordering::Relaxed);
        (hostile, polite)
    });

    let served: usize = hostile.iter().map(|t| t.served).sum();
    let refused: usize = hostile.iter().map(|t| t.refused).sum();
    let slowest_refusal = hostile
        .iter()
        .map(|t| t.slowest_refusal)
        .max()
        .unwrap_or_default();
    let mut refused_as = BTreeMap::new();
    for ((status, code), count) in hostile.iter().flat_map(|t| &t.refused_as) {
        *refused_as.entry(format!("{status} {code}")).or_insert(0) += count;
    }
    let problems: Vec<&String> = hostile.iter().flat_map(|t| &t.problems).collect();
    let rss_peak_kib = rss_peak_kib.load(Ordering::Relaxed);
    let summary = format!(
        "hostile: {served} served, {refused} refused {refused_as:?} (slowest refusal \
         {slowest_refusal:?}), {} problems; polite: {polite_ok} succeeded, {} problems; router RSS idle {rss_idle_kib} \
         KiB, peak {rss_peak_kib} KiB (cap {RSS_CAP_OVERLOAD_KIB} KiB)",
        problems.len(),
        polite_problems.len(),
    );
    eprintln!("{summary}");

    assert!(
        problems.is_empty(),
        "{summary}\nfirst problems: {:#?}\n{}",
        &problems[..problems.len().min(10)],
        site.logs()
    );
    assert!(
        polite_problems.is_empty(),
        "{summary}\n{polite_problems:#?}\n{}",
        site.logs()
    );
    // The overload was real: most requests were refused, by the capacity queue (503) and by the
    // admission gate (429), and the slots kept serving.
    assert!(refused > 4 * served, "{summary}");
    assert!(refused_as.contains_key("503 no_capacity"), "{summary}");
    assert!(
        refused_as.contains_key("429 concurrency_limit_exceeded"),
        "{summary}"
    );
    assert!(served >= SLOTS, "{summary}");
    assert!(polite_ok >= 10, "{summary}");
    assert!(rss_peak_kib < RSS_CAP_OVERLOAD_KIB, "{summary}");

    drop(idle);
    drop(slow);
    assert_router_settled(&site, true);
    // The slow sims finished everything they were given.
    for sim in [0, 1, 3] {
        site.wait_sim_metric(sim, "sim_in_flight", |v| v == 0.0);
    }
}

#[test]
fn partial_bodies_keep_the_router_under_its_memory_cap() {
    let site = overload_site("overload_partial_bodies");
    let router_pid = site.router.pid().expect("router pid");
    let rss_idle_kib = rss_kib(router_pid);

    let stop_sampling = AtomicBool::new(false);
    let rss_peak_kib = AtomicU64::new(0);
    let (polite_ok, polite_problems, sent_bytes) = std::thread::scope(|scope| {
        scope.spawn(|| sample_rss(router_pid, &stop_sampling, &rss_peak_kib));
        let (mut bodies, sent_bytes) = partial_bodies(
            site.http,
            PARTIAL_BODIES,
            PARTIAL_BODY_DECLARED,
            PARTIAL_BODY_SENT,
        );
        // While the bodies are held open the router still serves a well-behaved client.
        let until = Instant::now() + PARTIAL_HOLD;
        let http = site.http;
        let polite = scope.spawn(move || polite_client(http, until));
        trickle(&mut bodies, until);
        let polite = polite.join().unwrap();
        stop_sampling.store(true, Ordering::Relaxed);
        drop(bodies);
        (polite.0, polite.1, sent_bytes)
    });
    let rss_peak_kib = rss_peak_kib.load(Ordering::Relaxed);
    let summary = format!(
        "{PARTIAL_BODIES} partial bodies ({PARTIAL_BODY_DECLARED} bytes declared, \
         {PARTIAL_BODY_SENT} offered, {} MiB taken in all); router RSS idle {rss_idle_kib} KiB, peak \
         {rss_peak_kib} KiB (cap {RSS_CAP_PARTIAL_BODIES_KIB} KiB); polite: {polite_ok} succeeded, {} problems",
        sent_bytes >> 20,
        polite_problems.len()
    );
    eprintln!("{summary}");
    assert!(rss_peak_kib < RSS_CAP_PARTIAL_BODIES_KIB, "{summary}");
    assert!(
        polite_problems.is_empty(),
        "{summary}\n{polite_problems:#?}\n{}",
        site.logs()
    );
    assert!(polite_ok >= 5, "{summary}");
    assert_router_settled(&site, false);
}

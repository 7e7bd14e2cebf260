//! The redirect-claim path at a fixed rate (issue 37, "Redirect tokens stay single-use under
//! load"): fresh tokens claimed through `SiteTokens::spend` (a monoio shard) and the sync core's
//! `redirect_claims::serve` (its own tokio thread) against a real Valkey, at 10,000 tokens a
//! second for 3 s by default. Prints how many were taken, refused and left to the local check,
//! and the claim latency percentiles.
//!
//! `HIVENET_TEST_VALKEY_SERVER=…/valkey-server cargo bench --bench redirect_claims`
//! (`CLAIMS_PER_SECOND`, `CLAIM_SECONDS` change the rate and the length).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hivenet_router::router::config::sync::StoreSettings;
use hivenet_router::router::shard::redirect_claims::{SPEND_WAIT, SiteTokens, Spend};
use hivenet_router::router::sync::store::Store;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A throwaway valkey-server on a free port; killed when dropped.
struct Server(std::process::Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_valkey() -> Server {
    let binary = std::env::var("HIVENET_TEST_VALKEY_SERVER")
        .expect("HIVENET_TEST_VALKEY_SERVER names a valkey-server binary");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let child = std::process::Command::new(binary)
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("starting valkey-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "valkey-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server(child, port)
}

fn main() {
    let rate = env_or("CLAIMS_PER_SECOND", 10_000);
    let seconds = env_or("CLAIM_SECONDS", 3);
    let server = start_valkey();
    let settings = StoreSettings {
        addrs: vec![("127.0.0.1".to_string(), server.1)],
        sentinel_master: None,
        username: None,
        password: None,
        tls: false,
        tls_ca: None,
    };
    let store = Store::new(settings, "bench", "bench-router", SPEND_WAIT);
    let (tokens, claims, up) = SiteTokens::new();
    up.store(true, Ordering::Relaxed);
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(hivenet_router::router::sync::redirect_claims::serve(
                store, claims,
            ));
    });

    let total = rate * seconds;
    let results: Rc<RefCell<Vec<(Spend, Duration)>>> =
        Rc::new(RefCell::new(Vec::with_capacity(total as usize)));
    let mut runtime = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("a monoio runtime");
    let tokens = Arc::new(tokens);
    let started = Instant::now();
    runtime.block_on(async {
        // Warm the connection up: the first claim connects.
        let _ = tokens.spend(u128::MAX.to_be_bytes(), 60_000).await;
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(total as usize);
        for index in 0..total {
            let due = started + Duration::from_nanos(index * 1_000_000_000 / rate);
            let now = Instant::now();
            if due > now {
                monoio::time::sleep(due - now).await;
            }
            let (tokens, results) = (tokens.clone(), results.clone());
            tasks.push(monoio::spawn(async move {
                let asked = Instant::now();
                let nonce = (u128::from(index) << 1).to_be_bytes();
                let spend = tokens.spend(nonce, 60_000).await;
                results.borrow_mut().push((spend, asked.elapsed()));
            }));
        }
        for task in tasks {
            task.await;
        }
    });
    let elapsed = started.elapsed();
    let mut results = results.borrow_mut();
    let count = |kind: Spend| results.iter().filter(|(spend, _)| *spend == kind).count();
    let (first, again, refused, unchecked) = (
        count(Spend::First),
        count(Spend::Again),
        count(Spend::Refused),
        count(Spend::Unchecked),
    );
    results.sort_by_key(|(_, latency)| *latency);
    let at = |quantile: f64| results[((results.len() - 1) as f64 * quantile) as usize].1;
    println!(
        "redirect claims: {total} fresh tokens at {rate}/s in {:.2} s: {first} first use, {again} used already, {refused} refused, {unchecked} unchecked",
        elapsed.as_secs_f64()
    );
    println!(
        "claim latency: p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?}",
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0)
    );
}

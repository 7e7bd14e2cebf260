//! Redirect tokens across the routers of one site (seed `run-several-routers.md`, "What is
//! shared"): while the routers share a Valkey that answers, a token is accepted once by the whole
//! site, also under a flood of fresh tokens (a claim the store cannot take in time is refused, not
//! decided locally); while the store is unreachable, each router checks single use on its own.

mod common;

use common::valkey::Valkey;
use common::{Conn, Options, Site, chat, request};
use serde_json::{Value, json};

fn url(site: &Site) -> String {
    format!("http://{}", site.http)
}

fn push(site: &Site, map: &Value) {
    let body = map.to_string();
    let raw = format!(
        "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(request(site.http, raw.as_bytes()).status, 200);
}

/// A router of site `id`; `store`: the site's Valkey.
fn router(name: &str, id: &str, store: Option<&Valkey>, serves: bool) -> Site {
    let mut options = Options::new()
        .site(name, id)
        .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true");
    if let Some(store) = store {
        options = options.router_args(&[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &store.addr(),
            "--router-id",
            name,
            "--sync-interval",
            "200ms",
            "--sync-min-routers",
            "2",
        ]);
    }
    options = if serves {
        options
            .sim(&["--models", "far-model"])
            .agent(0, &[])
            .models(&["far-model"])
    } else {
        options.skip_model_wait()
    };
    Site::start(name, options)
}

/// A fresh token from `home` for `far-model`, as the `Location` path and query (no host).
fn token_path(home: &Site, first: &Site) -> String {
    let (status, headers, text) = home.post_json("/v1/chat/completions", &chat("far-model", false));
    assert_eq!(status, 307, "{text}");
    let location = headers
        .iter()
        .find(|(name, _)| name == "location")
        .map(|(_, value)| value.clone())
        .expect("a Location header");
    location
        .strip_prefix(&url(first))
        .unwrap_or_else(|| panic!("{location} is not on {}", url(first)))
        .to_owned()
}

fn post(site: &Site, target: &str) -> common::Response {
    let body = chat("far-model", false).to_string();
    let raw = format!(
        "POST {target} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

#[test]
fn a_redirect_token_is_accepted_once_by_the_whole_site() {
    let mut store = Valkey::primary();
    let home = router("redirect_home", "site-a", None, false);
    let b1 = router("redirect_b1", "site-b", Some(&store), true);
    let b2 = router("redirect_b2", "site-b", Some(&store), true);
    let map = json!({
        "sites": [{"id": "site-a", "url": url(&home)}, {"id": "site-b", "url": url(&b1)}],
        "placements": [{"model": "far-model", "kind": "chat", "site": "site-b"}],
    });
    for site in [&home, &b1, &b2] {
        push(site, &map);
    }
    for site in [&b1, &b2] {
        site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    }

    // The store answers: a token spent on one router is refused on the other.
    let target = token_path(&home, &b1);
    let served = post(&b1, &target);
    assert_eq!(served.status, 200, "{}", served.text());
    let replayed = post(&b2, &target);
    assert_eq!(replayed.status, 401, "{}", replayed.text());
    assert_eq!(
        replayed.json()["error"]["message"],
        "redirect token was already used"
    );

    // The store unreachable: each router checks single use on its own.
    store.kill();
    for site in [&b1, &b2] {
        site.wait_metric("hivenet_sync_up", |up| up == 0.0);
    }
    let target = token_path(&home, &b1);
    assert_eq!(post(&b1, &target).status, 200);
    assert_eq!(post(&b1, &target).status, 401, "still once per router");
    assert_eq!(
        post(&b2, &target).status,
        200,
        "the other router cannot know"
    );
}

/// Fresh tokens sent to every router of the site at once.
const FLOOD_TOKENS: usize = 500;

/// Sends every one of `targets` to `site` at once (one connection each, every request written
/// before any answer is read); the error code of each answer, `None` for a success.
fn flood(site: &Site, targets: &[String]) -> Vec<Option<String>> {
    let body = chat("far-model", false).to_string();
    let mut conns: Vec<Conn> = targets
        .iter()
        .map(|target| {
            let mut conn = Conn::connect(site.http);
            let raw = format!(
                "POST {target} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.send(raw.as_bytes()).expect("send");
            conn
        })
        .collect();
    conns
        .iter_mut()
        .map(|conn| {
            let response = conn.read_response().expect("an answer");
            (response.status >= 400).then(|| response.error_code())
        })
        .collect()
}

#[test]
fn a_flood_of_fresh_tokens_on_every_router_accepts_each_token_once_at_most() {
    let store = Valkey::primary();
    let home = router("flood_home", "site-a", None, false);
    let routers = [
        router("flood_b1", "site-b", Some(&store), true),
        router("flood_b2", "site-b", Some(&store), true),
        router("flood_b3", "site-b", Some(&store), true),
    ];
    let map = json!({
        "sites": [{"id": "site-a", "url": url(&home)}, {"id": "site-b", "url": url(&routers[0])}],
        "placements": [{"model": "far-model", "kind": "chat", "site": "site-b"}],
    });
    push(&home, &map);
    for site in &routers {
        push(site, &map);
        site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    }
    let targets: Vec<String> = (0..FLOOD_TOKENS)
        .map(|_| token_path(&home, &routers[0]))
        .collect();

    // Every token on every router at once: 500 fresh claims per router in flight together.
    let barrier = std::sync::Barrier::new(routers.len());
    let answers: Vec<Vec<Option<String>>> = std::thread::scope(|scope| {
        let floods: Vec<_> = routers
            .iter()
            .map(|site| {
                let (barrier, targets) = (&barrier, &targets);
                scope.spawn(move || {
                    barrier.wait();
                    flood(site, targets)
                })
            })
            .collect();
        floods
            .into_iter()
            .map(|flood| flood.join().expect("a flood"))
            .collect()
    });

    let mut accepted_twice = 0;
    let mut accepted = 0;
    for token in 0..FLOOD_TOKENS {
        // Refused as used (401) or as unchecked (503 queue_full); anything else got past the
        // token (served, or refused later for capacity).
        let taken = answers
            .iter()
            .filter(|answers| {
                !matches!(
                    answers[token].as_deref(),
                    Some("unauthorized" | "queue_full")
                )
            })
            .count();
        accepted += taken;
        if taken > 1 {
            accepted_twice += 1;
        }
    }
    let refused_unchecked = answers
        .iter()
        .flatten()
        .filter(|code| code.as_deref() == Some("queue_full"))
        .count();
    eprintln!(
        "{FLOOD_TOKENS} tokens on each of 3 routers: {accepted} accepted, {refused_unchecked} refused unchecked"
    );
    assert_eq!(
        accepted_twice, 0,
        "tokens accepted on more than one router ({accepted} accepted in all)"
    );
    assert!(
        accepted > FLOOD_TOKENS / 2,
        "most tokens are accepted once: {accepted} of {FLOOD_TOKENS}"
    );
}

use super::*;
use crate::base::ids::Capability;
use proptest::prelude::*;
use serde_json::{Value, json};

/// 2027-01-15T08:00:00Z.
const NOW: i64 = 1_800_000_000_000;

fn rules() -> MapRules {
    MapRules {
        local_site: "here".to_owned(),
        allowed_domains: vec!["example.com".to_owned()],
    }
}

fn parse(body: Value) -> Result<SiblingMap, MapError> {
    SiblingMap::parse(body.to_string().as_bytes(), &rules())
}

fn site(id: &str) -> Value {
    json!({"id": id, "url": format!("https://{id}.example.com")})
}

fn placement(model: &str, kind: &str, site: &str) -> Value {
    json!({"model": model, "kind": kind, "site": site})
}

/// A map with one site `a` and the given placements.
fn with_placements(placements: Vec<Value>) -> Result<SiblingMap, MapError> {
    parse(json!({"sites": [site("a")], "placements": placements}))
}

fn with_site(site: Value) -> Result<SiblingMap, MapError> {
    parse(json!({"sites": [site], "placements": []}))
}

fn url_error(url: &str) -> Option<&'static str> {
    match with_site(json!({"id": "a", "url": url})) {
        Err(MapError::BadUrl { reason, .. }) => Some(reason),
        _ => None,
    }
}

fn normalized(url: &str) -> Result<String, MapError> {
    with_site(json!({"id": "a", "url": url})).map(|map| map.sites()[0].url.clone())
}

/// The map of the redirect tests: every site in `warm` serves chat model `m` with that warm
/// hint, the local site `here` holds `m` at zero, and the hints were generated at `NOW` for 60s.
fn sibling_map(warm: &[(&str, Option<bool>)]) -> SiblingMap {
    let mut placements = vec![
        json!({"model": "m", "kind": "chat", "site": "here", "scale_from_zero": true, "warm": false}),
    ];
    for (id, warm) in warm {
        placements.push(json!({"model": "m", "kind": "chat", "site": id, "warm": warm}));
    }
    let sites: Vec<Value> = warm.iter().map(|(id, _)| site(id)).collect();
    parse(json!({
        "sites": sites,
        "placements": placements,
        "generated_at": "2027-01-15T08:00:00Z",
        "fresh_for": "60s",
    }))
    .expect("the test map is valid")
}

fn ask(key: &str, holdable_here: bool) -> RedirectAsk<'_> {
    RedirectAsk {
        local_site: "here",
        key,
        model: "m",
        kind: Kind::Chat,
        came_from: None,
        holdable_here,
        now_unix_ms: NOW,
    }
}

fn home_ids(map: &SiblingMap, ask: &RedirectAsk<'_>) -> Vec<String> {
    map.home_set(ask)
        .iter()
        .map(|member| member.site.id.clone())
        .collect()
}

#[test]
fn parses_the_documented_body() {
    let map = parse(json!({
        "sites": [{"id": "site-fr-1", "url": "https://fr1.example.com/"}],
        "placements": [
            {"model": "llama-3-70b", "kind": "chat", "site": "site-fr-1", "scale_from_zero": true, "hold_budget": "240s", "warm": false},
            {"model": "bge-m3", "kind": "embedding", "site": "here"}
        ],
        "generated_at": "2026-11-29T20:00:00Z",
        "fresh_for": "60s"
    }))
    .unwrap();
    assert_eq!(
        map.sites(),
        [Site {
            id: "site-fr-1".to_owned(),
            url: "https://fr1.example.com".to_owned()
        }]
    );
    assert_eq!(
        map.placements()[0],
        Placement {
            model: "llama-3-70b".to_owned(),
            kind: Kind::Chat,
            site: "site-fr-1".to_owned(),
            scale_from_zero: true,
            hold_budget: Some(Duration::from_secs(240)),
            warm: Some(false),
        }
    );
    let second = &map.placements()[1];
    assert_eq!(
        (second.scale_from_zero, second.hold_budget, second.warm),
        (false, None, None),
        "defaults"
    );
    assert_eq!(map.site("site-fr-1"), Some(&map.sites()[0]));
    assert_eq!(map.site("here"), None, "the local site need not be listed");
    assert!(
        map.placement("bge-m3", Kind::Embedding, "here").is_some()
            && map.placement("bge-m3", Kind::Chat, "here").is_none()
    );
}

#[test]
fn empty_arrays_make_an_empty_map() {
    let map = parse(json!({"sites": [], "placements": []})).unwrap();
    assert!(map.sites().is_empty() && map.placements().is_empty());
    assert!(!map.hints_fresh(NOW));
}

#[test]
fn kinds_follow_capabilities() {
    for kind in Kind::ALL {
        assert_eq!(Kind::of_capability(kind.capability()), kind);
        assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        assert_eq!(
            serde_json::to_value(kind).unwrap(),
            Value::from(kind.as_str())
        );
    }
    assert_eq!(Kind::of_capability(Capability::Llm), Kind::Chat);
    assert_eq!(Kind::of_capability(Capability::Embedding), Kind::Embedding);
    assert_eq!(Kind::of_capability(Capability::Reranker), Kind::Rerank);
    assert_eq!(Kind::parse("Chat"), None);
}

#[test]
fn refuses_bodies_that_are_not_maps() {
    for body in [
        &b"not json"[..],
        b"[]",
        b"{\"sites\": {}, \"placements\": []}",
        b"{\"sites\": [], \"placements\": [], \"extra\": 1}",
        b"{\"sites\": [], \"placements\": [], \"fresh_for\": 60}",
    ] {
        let error = SiblingMap::parse(body, &rules()).unwrap_err();
        assert!(matches!(error, MapError::Json(_)), "{error}");
    }
    let error = parse(json!({"sites": [], "placements": [], "extra": 1})).unwrap_err();
    assert!(
        error.to_string().contains("unknown field `extra`"),
        "{error}"
    );
    assert_eq!(
        parse(json!({"placements": []})),
        Err(MapError::MissingArray("sites"))
    );
    assert_eq!(
        parse(json!({"sites": null, "placements": []})),
        Err(MapError::MissingArray("sites"))
    );
    assert_eq!(
        parse(json!({"sites": []})).unwrap_err().to_string(),
        "placements is required: an array, possibly empty"
    );
}

#[test]
fn entries_of_the_wrong_shape_are_named() {
    let error =
        with_site(json!({"id": "a", "url": "https://a.example.com", "region": "eu"})).unwrap_err();
    assert!(
        matches!(&error, MapError::Entry { at, reason } if at == "sites[0]" && reason.contains("unknown field `region`")),
        "{error}"
    );
    let error = with_placements(vec![
        placement("m", "chat", "a"),
        json!({"kind": "chat", "site": "a"}),
    ])
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("placements[1]: missing field `model`"),
        "{error}"
    );
    let error = with_placements(vec![
        json!({"model": "m", "kind": "chat", "site": "a", "scale_from_zero": "yes"}),
    ])
    .unwrap_err();
    assert!(
        matches!(&error, MapError::Entry { at, .. } if at == "placements[0]"),
        "{error}"
    );
    let error = with_placements(vec![json!("m")]).unwrap_err();
    assert!(
        matches!(&error, MapError::Entry { at, .. } if at == "placements[0]"),
        "{error}"
    );
}

#[test]
fn site_ids_are_short_plain_and_unique() {
    let bad_id = |id: &str| match with_site(json!({"id": id, "url": "https://a.example.com"})) {
        Err(MapError::BadSiteId { reason, .. }) => Some(reason),
        _ => None,
    };
    assert_eq!(bad_id(""), Some("is empty"));
    assert_eq!(bad_id(&"s".repeat(129)), Some("is longer than 128 bytes"));
    assert_eq!(bad_id(&"s".repeat(128)), None);
    for id in ["site fr", "site/fr", "sité", "a:b"] {
        assert_eq!(
            bad_id(id),
            Some("has a character outside [A-Za-z0-9._-]"),
            "{id}"
        );
    }
    assert_eq!(bad_id("Site_fr-1.b"), None);
    assert_eq!(
        parse(json!({"sites": [site("a"), site("b"), site("a")], "placements": []}))
            .unwrap_err()
            .to_string(),
        "sites[2].id: \"a\" is already the id of sites[0]"
    );
}

#[test]
fn site_urls_are_http_bases_without_query_or_user_info() {
    assert_eq!(
        normalized("https://a.example.com/").unwrap(),
        "https://a.example.com"
    );
    assert_eq!(
        normalized("http://a.example.com:8443/router/v2//").unwrap(),
        "http://a.example.com:8443/router/v2"
    );
    assert_eq!(
        normalized("https://A.Example.COM").unwrap(),
        "https://A.Example.COM"
    );
    for (url, reason) in [
        (
            "ftp://a.example.com",
            "does not start with http:// or https://",
        ),
        ("a.example.com", "does not start with http:// or https://"),
        (
            "HTTPS://a.example.com",
            "does not start with http:// or https://",
        ),
        ("https://a.example.com/?x=1", "has a query"),
        ("https://a.example.com/#top", "has a fragment"),
        ("https://user@a.example.com", "has user info"),
        ("https://user:pw@a.example.com/", "has user info"),
        ("https://", "has no host"),
        ("https://:443/", "has no host"),
        ("https://a..example.com", "has an empty label in its host"),
        ("https://a.example.com.", "has an empty label in its host"),
        (
            "https://a_b.example.com",
            "has a host character outside [A-Za-z0-9.-]",
        ),
        (
            "https://a.example.com\\.evil.org",
            "has a host character outside [A-Za-z0-9.-]",
        ),
        ("https://a.example.com:0", "has a port outside 1-65535"),
        ("https://a.example.com:65536", "has a port outside 1-65535"),
        ("https://a.example.com:", "has a port outside 1-65535"),
        ("https://a.example.com:+80", "has a port outside 1-65535"),
        (
            "https://a.example.com/a b",
            "has a path character that is not allowed in a URL",
        ),
        (
            "https://a.example.com/a\\b",
            "has a path character that is not allowed in a URL",
        ),
        ("https://[::1", "has an unclosed IPv6 bracket"),
        ("https://[]/", "has an invalid IPv6 host"),
        ("https://[::1]x", "has text after the IPv6 host"),
    ] {
        assert_eq!(url_error(url), Some(reason), "{url}");
    }
    let long = format!("https://a.example.com/{}", "p".repeat(MAX_URL_BYTES));
    assert_eq!(url_error(&long), Some("is longer than 2048 bytes"));
    let error = with_site(json!({"id": "a", "url": "https://a.example.com/?x=1"})).unwrap_err();
    assert_eq!(
        error.to_string(),
        "sites[0].url: \"https://a.example.com/?x=1\" has a query"
    );
}

#[test]
fn sibling_hosts_must_be_under_an_allowed_domain() {
    let host_allowed = |url: &str| normalized(url).is_ok();
    assert!(host_allowed("https://example.com"));
    assert!(host_allowed("https://fr1.example.com"));
    assert!(host_allowed("https://a.b.example.com:8443/x"));
    assert!(host_allowed("https://FR1.EXAMPLE.com"), "letter case");
    assert!(!host_allowed("https://badexample.com"));
    assert!(!host_allowed("https://example.com.evil.org"));
    assert!(!host_allowed("https://example.org"));
    assert!(!host_allowed("https://127.0.0.1"));
    assert!(!host_allowed("https://[::1]:8080"));
    assert_eq!(
        with_site(json!({"id": "a", "url": "https://badexample.com"}))
            .unwrap_err()
            .to_string(),
        "sites[0].url: host \"badexample.com\" is not an allowed domain or a subdomain of one"
    );

    // The local site's URL is never a redirect target: any well-formed URL will do.
    let local = |url: &str| with_site(json!({"id": "here", "url": url}));
    assert!(local("http://10.0.0.5:8080").is_ok());
    assert!(local("http://[fd00::5]:8080/").is_ok());
    assert!(matches!(
        local("http://10.0.0.5/?q"),
        Err(MapError::BadUrl { .. })
    ));

    // Allowed domains are compared without case or surrounding dots; none allows no sibling.
    let domains = |allowed: &[&str], url: &str| {
        let rules = MapRules {
            local_site: "here".to_owned(),
            allowed_domains: allowed.iter().map(|domain| domain.to_string()).collect(),
        };
        let body = json!({"sites": [{"id": "a", "url": url}], "placements": []});
        SiblingMap::parse(body.to_string().as_bytes(), &rules).is_ok()
    };
    assert!(domains(&["Example.COM"], "https://a.example.com"));
    assert!(domains(&[".example.com"], "https://a.example.com"));
    assert!(domains(
        &["other.net", "example.com"],
        "https://example.com"
    ));
    assert!(!domains(&[], "https://a.example.com"));
    assert!(!domains(&[""], "https://a.example.com"));
    assert!(!domains(&["a.example.com"], "https://example.com"));
}

#[test]
fn placements_name_a_model_a_kind_and_a_known_site() {
    assert_eq!(
        with_placements(vec![placement("", "chat", "a")])
            .unwrap_err()
            .to_string(),
        "placements[0].model: is empty"
    );
    let long = "m".repeat(MAX_MODEL_BYTES + 1);
    assert_eq!(
        with_placements(vec![placement(&long, "chat", "a")]),
        Err(MapError::BadModel {
            index: 0,
            reason: "is longer than 256 bytes"
        })
    );
    assert!(with_placements(vec![placement(&long[1..], "chat", "a")]).is_ok());
    assert_eq!(
        with_placements(vec![
            placement("m", "chat", "a"),
            placement("m", "image", "a")
        ])
        .unwrap_err()
        .to_string(),
        "placements[1].kind: \"image\" is not one of chat, embedding, rerank"
    );
    assert_eq!(
        with_placements(vec![placement("m", "rerank", "b")])
            .unwrap_err()
            .to_string(),
        "placements[0].site: \"b\" is neither a listed site nor the local site"
    );
    // The local site may carry placements without being listed.
    assert!(with_placements(vec![placement("m", "rerank", "here")]).is_ok());
}

#[test]
fn hold_budgets_are_over_zero_and_at_most_an_hour() {
    let budget = |text: &str| {
        let mut placements: Vec<Value> = (0..3)
            .map(|n| placement(&format!("m{n}"), "chat", "a"))
            .collect();
        placements.push(json!({"model": "big", "kind": "chat", "site": "a", "scale_from_zero": true, "hold_budget": text}));
        with_placements(placements).map(|map| map.placements()[3].hold_budget)
    };
    assert_eq!(
        budget("2h").unwrap_err().to_string(),
        "placements[3].hold_budget: \"2h\" is over 1h"
    );
    assert_eq!(budget("1h"), Ok(Some(Duration::from_secs(3600))));
    assert_eq!(
        budget("59m60.001s").unwrap_err().to_string(),
        "placements[3].hold_budget: \"59m60.001s\" is over 1h"
    );
    assert_eq!(budget("1ms"), Ok(Some(Duration::from_millis(1))));
    assert_eq!(
        budget("0").unwrap_err().to_string(),
        "placements[3].hold_budget: \"0\" is not greater than 0"
    );
    for text in ["", "240", "-5s", "5d", "soon"] {
        assert!(
            matches!(
                budget(text),
                Err(MapError::BadHoldBudget {
                    reason: "is not a Go duration (e.g. 240s)",
                    ..
                })
            ),
            "{text}"
        );
    }
    // Checked on every placement, used only with scale_from_zero.
    let map = with_placements(vec![
        json!({"model": "m", "kind": "chat", "site": "here", "hold_budget": "90s"}),
    ])
    .unwrap();
    assert_eq!(
        map.placements()[0].hold_budget,
        Some(Duration::from_secs(90))
    );
    assert_eq!(map.hold_here("here", "m", Kind::Chat), None);
    assert!(matches!(
        with_placements(vec![
            json!({"model": "m", "kind": "chat", "site": "here", "hold_budget": "2h"})
        ]),
        Err(MapError::BadHoldBudget { .. })
    ));
}

#[test]
fn a_model_is_placed_once_per_kind_and_site() {
    assert_eq!(
        with_placements(vec![
            placement("m", "chat", "a"),
            placement("m", "embedding", "a"),
            placement("m", "chat", "here"),
            json!({"model": "m", "kind": "chat", "site": "a", "scale_from_zero": true}),
        ])
        .unwrap_err(),
        MapError::DuplicatePlacement {
            index: 3,
            model: "m".to_owned(),
            kind: "chat",
            site: "a".to_owned(),
            first: 0
        }
    );
}

#[test]
fn the_freshness_window_needs_both_fields() {
    let window = |generated_at: Option<&str>, fresh_for: Option<&str>| {
        let mut body = json!({"sites": [], "placements": []});
        if let Some(generated_at) = generated_at {
            body["generated_at"] = json!(generated_at);
        }
        if let Some(fresh_for) = fresh_for {
            body["fresh_for"] = json!(fresh_for);
        }
        parse(body)
    };
    assert!(window(Some("2026-11-29T20:00:00Z"), Some("60s")).is_ok());
    assert!(window(Some("2026-11-29T21:00:00.250+01:00"), Some("1.5s")).is_ok());
    assert!(window(None, None).is_ok());
    assert_eq!(
        window(Some("yesterday"), Some("60s")),
        Err(MapError::BadGeneratedAt("yesterday".to_owned()))
    );
    assert!(matches!(
        window(Some("2026-11-29 20:00:00"), Some("60s")),
        Err(MapError::BadGeneratedAt(_))
    ));
    assert_eq!(
        window(Some("2026-11-29T20:00:00Z"), Some("0"))
            .unwrap_err()
            .to_string(),
        "fresh_for: \"0\" is not greater than 0"
    );
    assert_eq!(
        window(Some("2026-11-29T20:00:00Z"), Some("60")),
        Err(MapError::BadFreshFor {
            text: "60".to_owned(),
            reason: "is not a Go duration (e.g. 60s)"
        })
    );
    assert_eq!(
        window(Some("2026-11-29T20:00:00Z"), None)
            .unwrap_err()
            .to_string(),
        "generated_at is set without fresh_for: the freshness window needs both"
    );
    assert_eq!(
        window(None, Some("60s")),
        Err(MapError::HalfFreshness {
            present: "fresh_for",
            missing: "generated_at"
        })
    );
}

#[test]
fn hints_are_fresh_from_generation_until_the_window_ends() {
    let map = sibling_map(&[("a", None)]);
    assert!(!map.hints_fresh(NOW - 1), "generated in the future");
    assert!(map.hints_fresh(NOW));
    assert!(map.hints_fresh(NOW + 59_999));
    assert!(!map.hints_fresh(NOW + 60_000));
    assert!(!map.hints_fresh(i64::MAX) && !map.hints_fresh(i64::MIN));

    let sub_millisecond = parse(json!({
        "sites": [], "placements": [],
        "generated_at": "2027-01-15T08:00:00Z", "fresh_for": "500us"
    }))
    .unwrap();
    assert!(sub_millisecond.hints_fresh(NOW) && !sub_millisecond.hints_fresh(NOW + 1));
    let no_window = parse(json!({"sites": [], "placements": []})).unwrap();
    assert!(!no_window.hints_fresh(NOW));
}

#[test]
fn sizes_are_capped() {
    let sites: Vec<Value> = (0..=MAX_SITES).map(|n| site(&format!("s{n}"))).collect();
    assert_eq!(
        parse(json!({"sites": sites, "placements": []})),
        Err(MapError::TooMany {
            field: "sites",
            count: MAX_SITES + 1,
            max: MAX_SITES
        })
    );
    assert!(parse(json!({"sites": sites[..MAX_SITES], "placements": []})).is_ok());
    // Entries past the cap are counted, not decoded: their shape does not matter.
    let placements = vec![json!({}); MAX_PLACEMENTS + 2];
    assert_eq!(
        parse(json!({"sites": [], "placements": placements}))
            .unwrap_err()
            .to_string(),
        "placements has 65538 entries, at most 65536"
    );
}

#[test]
fn hold_here_needs_a_local_placement_with_scale_from_zero() {
    let map = parse(json!({
        "sites": [site("a"), {"id": "here", "url": "http://10.0.0.1:8080"}],
        "placements": [
            {"model": "m", "kind": "chat", "site": "here", "scale_from_zero": true, "hold_budget": "240s"},
            {"model": "m", "kind": "embedding", "site": "here", "scale_from_zero": true},
            {"model": "m", "kind": "rerank", "site": "here"},
            {"model": "n", "kind": "chat", "site": "a", "scale_from_zero": true},
            {"model": "o", "kind": "chat", "site": "here", "scale_from_zero": false, "hold_budget": "10s"},
        ]
    }))
    .unwrap();
    assert_eq!(
        map.hold_here("here", "m", Kind::Chat),
        Some(Some(Duration::from_secs(240)))
    );
    assert_eq!(map.hold_here("here", "m", Kind::Embedding), Some(None));
    assert_eq!(
        map.hold_here("here", "m", Kind::Rerank),
        None,
        "no scale_from_zero"
    );
    assert_eq!(
        map.hold_here("here", "n", Kind::Chat),
        None,
        "placed elsewhere"
    );
    assert_eq!(map.hold_here("a", "n", Kind::Chat), Some(None));
    assert_eq!(map.hold_here("here", "o", Kind::Chat), None);
    assert_eq!(map.hold_here("here", "absent", Kind::Chat), None);
    assert_eq!(
        map.held_here("here"),
        vec![("m", Kind::Chat), ("m", Kind::Embedding)]
    );
    assert_eq!(map.held_here("a"), vec![("n", Kind::Chat)]);
    assert!(map.held_here("elsewhere").is_empty());
}

#[test]
fn to_json_gives_back_the_same_map() {
    let map = parse(json!({
        "sites": [{"id": "a", "url": "https://a.example.com/v1/"}, site("b")],
        "placements": [
            {"model": "m", "kind": "chat", "site": "a", "scale_from_zero": true, "hold_budget": "4m", "warm": true},
            {"model": "m", "kind": "rerank", "site": "here", "hold_budget": "1.5s"},
            {"model": "e", "kind": "embedding", "site": "b", "warm": false},
        ],
        "generated_at": "2026-11-29T21:00:00.250+01:00",
        "fresh_for": "1m30s"
    }))
    .unwrap();
    let json: Value = serde_json::from_slice(&map.to_json()).unwrap();
    assert_eq!(
        json,
        json!({
            "sites": [{"id": "a", "url": "https://a.example.com/v1"}, site("b")],
            "placements": [
                {"model": "m", "kind": "chat", "site": "a", "scale_from_zero": true, "hold_budget": "240s", "warm": true},
                {"model": "m", "kind": "rerank", "site": "here", "scale_from_zero": false, "hold_budget": "1500ms"},
                {"model": "e", "kind": "embedding", "site": "b", "scale_from_zero": false, "warm": false},
            ],
            "generated_at": "2026-11-29T20:00:00.250Z",
            "fresh_for": "90s"
        })
    );
    assert_eq!(SiblingMap::parse(&map.to_json(), &rules()), Ok(map));

    let bare = parse(json!({"sites": [], "placements": []})).unwrap();
    assert_eq!(bare.to_json(), br#"{"sites":[],"placements":[]}"#);
}

#[test]
fn durations_and_times_print_as_they_parse() {
    for (duration, text) in [
        (Duration::from_secs(240), "240s"),
        (Duration::from_millis(1500), "1500ms"),
        (Duration::from_micros(7), "7us"),
        (Duration::from_nanos(1_000_000_001), "1000000001ns"),
    ] {
        assert_eq!(go_duration(duration), text);
        assert_eq!(crate::base::duration::parse(text), Ok(duration));
    }
    assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339_utc(NOW + 7), "2027-01-15T08:00:00.007Z");
    assert_eq!(rfc3339_utc(-1), "1969-12-31T23:59:59.999Z");
    for unix_ms in [0, NOW + 7, -1, 253_402_300_799_999] {
        assert_eq!(
            crate::logic::auth::config::parse_rfc3339_unix_ms(&rfc3339_utc(unix_ms)),
            Some(unix_ms)
        );
    }
}

#[test]
fn home_scores_are_fixed_across_processes() {
    // Computed independently: SHA-256 in Python over the same bytes.
    assert_eq!(
        home_score("key-1", "llama-3-70b", Kind::Chat, "site-fr-1"),
        1_798_580_303_242_871_336
    );
    assert_eq!(
        home_score("", "m", Kind::Rerank, "b"),
        7_792_361_300_223_378_025
    );
}

#[test]
fn the_home_set_is_the_two_best_scored_sites_serving_the_model() {
    let sites = ["a", "b", "c", "d", "e"];
    let map = sibling_map(&sites.map(|id| (id, None)));
    for key in ["", "key-1", "key-2", "key-3"] {
        let ask = ask(key, false);
        let mut ranked: Vec<(u64, &str)> = sites
            .iter()
            .map(|id| (home_score(key, "m", Kind::Chat, id), *id))
            .collect();
        ranked.sort_by(|left, right| right.0.cmp(&left.0).then(left.1.cmp(right.1)));
        let expected: Vec<String> = ranked[..2].iter().map(|(_, id)| id.to_string()).collect();
        assert_eq!(home_ids(&map, &ask), expected, "key {key:?}");
        assert_eq!(home_ids(&map, &ask), home_ids(&map.clone(), &ask), "stable");
        assert_eq!(
            map.choose_site(&RedirectAsk {
                now_unix_ms: NOW + 60_000,
                ..ask
            })
            .map(|site| site.id.as_str()),
            Some(expected[0].as_str()),
            "stale hints: the best-scored member"
        );
    }
    // Fewer candidates than the home set's size.
    let one = sibling_map(&[("a", None)]);
    assert_eq!(home_ids(&one, &ask("k", false)), ["a"]);
    assert_eq!(one.home_set(&ask("k", false)).len(), 1);
}

#[test]
fn ties_rank_by_site_id() {
    let site = Site {
        id: "b".to_owned(),
        url: String::new(),
    };
    let other = Site {
        id: "a".to_owned(),
        ..site.clone()
    };
    let placement = Placement {
        model: "m".to_owned(),
        kind: Kind::Chat,
        site: String::new(),
        scale_from_zero: false,
        hold_budget: None,
        warm: None,
    };
    let mut home = HomeSet::default();
    for site in [&site, &other] {
        home.offer(HomeMember {
            site,
            placement: &placement,
            score: 9,
        });
    }
    home.offer(HomeMember {
        site: &site,
        placement: &placement,
        score: 3,
    });
    let ids: Vec<&str> = home.iter().map(|member| member.site.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
}

#[test]
fn candidates_serve_the_model_for_the_kind_elsewhere() {
    let map = parse(json!({
        "sites": [site("a"), site("b"), site("c"), {"id": "here", "url": "http://10.0.0.1"}],
        "placements": [
            {"model": "m", "kind": "chat", "site": "here"},
            {"model": "m", "kind": "chat", "site": "a", "scale_from_zero": true},
            {"model": "m", "kind": "embedding", "site": "b"},
            {"model": "other", "kind": "chat", "site": "c"},
        ]
    }))
    .unwrap();
    // Only `a` serves chat `m` elsewhere; scale_from_zero there still serves it.
    assert_eq!(home_ids(&map, &ask("k", false)), ["a"]);
    assert_eq!(
        home_ids(
            &map,
            &RedirectAsk {
                kind: Kind::Embedding,
                ..ask("k", false)
            }
        ),
        ["b"]
    );
    assert_eq!(
        map.choose_site(&RedirectAsk {
            model: "absent",
            ..ask("k", false)
        }),
        None,
        "no candidate"
    );
    assert_eq!(
        map.choose_site(&RedirectAsk {
            came_from: Some("a"),
            ..ask("k", false)
        }),
        None,
        "the only candidate sent the request here"
    );
}

#[test]
fn came_from_is_never_chosen() {
    let map = sibling_map(&[("a", Some(true)), ("b", Some(true)), ("c", Some(true))]);
    for key in ["k1", "k2", "k3", "k4"] {
        let home = home_ids(&map, &ask(key, false));
        let from = RedirectAsk {
            came_from: Some(home[0].as_str()),
            ..ask(key, false)
        };
        let chosen = map.choose_site(&from).unwrap();
        assert_ne!(chosen.id, home[0]);
        assert!(!home_ids(&map, &from).contains(&home[0]));
    }
}

#[test]
fn a_cold_home_set_keeps_a_holdable_request_here() {
    let sites = ["a", "b", "c", "d"];
    let unknown = sibling_map(&sites.map(|id| (id, None)));
    for key in ["k1", "k2", "k3"] {
        let home = home_ids(&unknown, &ask(key, true));
        // The home set cold, every other site warm.
        let hints: Vec<(&str, Option<bool>)> = sites
            .iter()
            .map(|id| {
                let in_home = home.iter().any(|member| member == id);
                (*id, Some(!in_home))
            })
            .collect();
        let map = sibling_map(&hints);
        assert_eq!(
            home_ids(&map, &ask(key, true)),
            home,
            "hints do not move the home set"
        );
        assert_eq!(
            map.choose_site(&ask(key, true)),
            None,
            "warm sites outside the home set do not prevent the hold"
        );
        let chosen = |ask: RedirectAsk<'_>| map.choose_site(&ask).map(|site| site.id.clone());
        assert_eq!(
            chosen(ask(key, false)),
            Some(home[0].clone()),
            "not holdable here: redirect to the best-scored member"
        );
        assert_eq!(
            chosen(RedirectAsk {
                now_unix_ms: NOW + 60_000,
                ..ask(key, true)
            }),
            Some(home[0].clone()),
            "stale hints are not trusted"
        );

        // Unknown is not cold.
        let hints: Vec<(&str, Option<bool>)> = sites
            .iter()
            .map(|id| {
                let warm = if *id == home[1] { None } else { Some(false) };
                (*id, warm)
            })
            .collect();
        let map = sibling_map(&hints);
        assert_eq!(
            map.choose_site(&ask(key, true)).map(|site| site.id.clone()),
            Some(home[0].clone())
        );
    }
}

#[test]
fn a_warm_home_member_is_preferred_while_hints_are_fresh() {
    let sites = ["a", "b", "c"];
    let unknown = sibling_map(&sites.map(|id| (id, None)));
    for key in ["k1", "k2", "k3"] {
        let home = home_ids(&unknown, &ask(key, true));
        let warm_only = |warm_site: &str| sibling_map(&sites.map(|id| (id, Some(id == warm_site))));
        let map = warm_only(&home[1]);
        let chosen = |ask: RedirectAsk<'_>| map.choose_site(&ask).map(|site| site.id.clone());
        assert_eq!(chosen(ask(key, true)), Some(home[1].clone()));
        assert_eq!(chosen(ask(key, false)), Some(home[1].clone()));
        assert_eq!(
            chosen(RedirectAsk {
                now_unix_ms: NOW - 1,
                ..ask(key, false)
            }),
            Some(home[0].clone()),
            "hints not yet fresh"
        );
        let both_warm = sibling_map(&sites.map(|id| (id, Some(true))));
        assert_eq!(
            both_warm
                .choose_site(&ask(key, true))
                .map(|site| site.id.clone()),
            Some(home[0].clone())
        );
    }
}

#[test]
fn the_local_site_is_never_a_candidate() {
    let map = parse(json!({
        "sites": [{"id": "here", "url": "https://here.example.com"}, site("a")],
        "placements": [
            {"model": "m", "kind": "chat", "site": "here", "warm": true},
            {"model": "m", "kind": "chat", "site": "a"},
        ]
    }))
    .unwrap();
    for key in ["k1", "k2", "k3"] {
        assert_eq!(home_ids(&map, &ask(key, false)), ["a"]);
    }
}

/// A map whose listed sites all serve chat model `m`.
fn serving(sites: &[String]) -> SiblingMap {
    let site_entries: Vec<Value> = sites.iter().map(|id| site(id)).collect();
    let placements: Vec<Value> = sites.iter().map(|id| placement("m", "chat", id)).collect();
    parse(json!({"sites": site_entries, "placements": placements})).unwrap()
}

proptest! {
    /// Rendezvous hashing: adding a site leaves a key's home set unchanged or brings the new site
    /// into it, and removing a site outside the home set leaves it unchanged.
    #[test]
    fn home_sets_move_only_for_their_own_sites(
        site_count in 0usize..8,
        key in "[a-z0-9-]{0,12}",
        new_site in "[a-z]{1,6}",
        removed in 0usize..8,
    ) {
        let sites: Vec<String> = (0..site_count).map(|n| format!("s{n}")).collect();
        let ask = RedirectAsk { key: &key, ..ask("", false) };
        let before = home_ids(&serving(&sites), &ask);
        prop_assert!(before.len() <= HOME_SET_SIZE);
        prop_assert_eq!(before.len(), site_count.min(HOME_SET_SIZE));

        let mut grown = sites.clone();
        grown.push(new_site.clone());
        let after = home_ids(&serving(&grown), &ask);
        prop_assert!(after == before || after.contains(&new_site), "{before:?} -> {after:?}");

        if site_count > 0 {
            let removed = &sites[removed % site_count];
            if !before.contains(removed) {
                let shrunk: Vec<String> = sites.iter().filter(|id| *id != removed).cloned().collect();
                prop_assert_eq!(home_ids(&serving(&shrunk), &ask), before);
            }
        }
    }
}

#[test]
fn deeply_nested_maps_are_refused_before_parsing() {
    let body = format!(
        "{{\"sites\": [], \"placements\": {}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    match SiblingMap::parse(body.as_bytes(), &rules()) {
        Err(MapError::Json(message)) => {
            assert_eq!(message, "nesting deeper than 64 levels (line 1)")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

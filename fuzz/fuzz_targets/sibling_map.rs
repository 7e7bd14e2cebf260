//! Sibling-map JSON (`sibling::map`): the `PUT /admin/sibling-map` body, parsed and validated,
//! and the redirect decision made on the result.
//!
//! Asserts:
//! - `parse` never panics, and an accepted map keeps its invariants: unique site ids, every
//!   placement on a listed site or the local one;
//! - round trip: an accepted map serialized by `to_json` (`GET /admin/sibling-map`) parses back to
//!   the same map, and serializes again to the same bytes;
//! - the redirect decision, for every placed model and kind, only ever names a listed site other
//!   than this one and the one the request came from, and that site is in the home set.
#![no_main]

use std::collections::HashSet;

use hivenet_router::logic::sibling::map::{HOME_SET_SIZE, Kind, MapRules, RedirectAsk, SiblingMap};
use libfuzzer_sys::fuzz_target;

const LOCAL_SITE: &str = "site-local";
/// Inside the seed maps' freshness windows (2026-11-29T20:00:30Z).
const NOW_UNIX_MS: i64 = 1_795_982_430_000;

fuzz_target!(|body: &[u8]| {
    let rules = MapRules {
        local_site: LOCAL_SITE.to_owned(),
        allowed_domains: vec!["example.com".to_owned(), "hivenet.test".to_owned()],
    };
    let Ok(map) = SiblingMap::parse(body, &rules) else {
        return;
    };

    let mut ids = HashSet::new();
    for site in map.sites() {
        assert!(ids.insert(site.id.as_str()), "duplicate site {:?}", site.id);
        assert!(map.site(&site.id).is_some());
    }
    for placement in map.placements() {
        assert!(placement.site == LOCAL_SITE || ids.contains(placement.site.as_str()));
        assert!(
            map.placement(&placement.model, placement.kind, &placement.site)
                .is_some()
        );
    }

    let json = map.to_json();
    let again = SiblingMap::parse(&json, &rules).expect("a serialized map parses");
    assert_eq!(again, map, "the map changed through to_json");
    assert_eq!(again.to_json(), json);

    let _ = map.held_here(LOCAL_SITE);
    for now_unix_ms in [NOW_UNIX_MS, i64::MIN, i64::MAX] {
        let _ = map.hints_fresh(now_unix_ms);
    }
    for placement in map.placements().iter().take(64) {
        for came_from in [None, Some(placement.site.as_str())] {
            for holdable_here in [false, true] {
                let ask = RedirectAsk {
                    local_site: LOCAL_SITE,
                    key: "key-1",
                    model: &placement.model,
                    kind: placement.kind,
                    came_from,
                    holdable_here,
                    now_unix_ms: NOW_UNIX_MS,
                };
                let home = map.home_set(&ask);
                assert!(home.len() <= HOME_SET_SIZE);
                let Some(site) = map.choose_site(&ask) else {
                    continue;
                };
                assert_ne!(site.id, LOCAL_SITE);
                assert_ne!(Some(site.id.as_str()), came_from);
                assert!(ids.contains(site.id.as_str()));
                assert!(home.iter().any(|member| member.site.id == site.id));
            }
        }
        let _ = map.hold_here(LOCAL_SITE, &placement.model, placement.kind);
        let _ = Kind::parse(placement.kind.as_str());
    }
});

//! Measures what one dynamic-key write costs the control core at 50,000 keys, as the admin API
//! makes it: the registry write (`DynamicRegistry::put` or `delete`), then the snapshot the
//! shards read (`DynamicRegistry::snapshot`), while the snapshot before it is still held.
//!
//! Nothing is asserted here. Run: `cargo bench --bench keys`. On 2026-12-02, 2 cores, this source
//! built against bb2e4df (each write built the whole snapshot again) and against the snapshot
//! kept write by write (`auth::keys::live`), run in turn twice: updating a key 64-78 ms before,
//! 0.42-0.48 ms after; adding a key then deleting it 157-174 ms before, 0.69-0.75 ms after.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use hivenet_router::logic::auth::config::ServerlessLimits;
use hivenet_router::logic::auth::dynamic::{DynamicRegistry, PutKeyRequest, ReplaceRequest};
use hivenet_router::logic::auth::key_hash::hash_key_hex;

const KEYS: usize = 50_000;

fn entry(index: usize) -> serde_json::Value {
    serde_json::json!({
        "id": format!("key-{index:06}"),
        "key_hash": hash_key_hex(&format!("sk-bench-{index}")),
        "key_preview": "sk-...bench",
        "owner": format!("tenant-{}", index % 1_000),
        "name": format!("bench key {index}"),
        "enabled": true,
        "allowed_models": ["model-a", "model-b"],
        "quota": {"requests_per_minute": 600, "tokens_per_day": 1_000_000},
    })
}

fn registry() -> DynamicRegistry {
    let body = serde_json::json!({
        "version": "rev_00000001",
        "keys": (0..KEYS).map(entry).collect::<Vec<_>>(),
    });
    let request = ReplaceRequest::from_json(body.to_string().as_bytes()).unwrap();
    let mut registry = DynamicRegistry::new();
    registry
        .replace(request, &ServerlessLimits::none())
        .unwrap();
    registry
}

fn put_body(index: usize) -> Vec<u8> {
    let mut body = entry(index);
    body["version"] = "rev_00000002".into();
    body.to_string().into_bytes()
}

fn bench(c: &mut Criterion) {
    let limits = ServerlessLimits::none();
    let mut registry = registry();
    let update = put_body(7);
    let added = put_body(KEYS + 1);
    let delete_version = Some("rev_00000002");
    // What the shards hold while the control core writes: the snapshot before the write.
    let mut held = registry.snapshot();
    let mut group = c.benchmark_group("dynamic_keys_50k");
    group.sample_size(10);
    group.bench_function("update_a_key", |b| {
        b.iter(|| {
            let request = PutKeyRequest::from_json(&update).unwrap();
            registry.put("key-000007", request, &limits).unwrap();
            held = black_box(registry.snapshot());
        })
    });
    group.bench_function("add_a_key_then_delete_it", |b| {
        b.iter(|| {
            let request = PutKeyRequest::from_json(&added).unwrap();
            registry.put("key-added", request, &limits).unwrap();
            held = black_box(registry.snapshot());
            registry.delete("key-added", delete_version).unwrap();
            held = black_box(registry.snapshot());
        })
    });
    group.finish();
    drop(held);
}

criterion_group!(benches, bench);
criterion_main!(benches);

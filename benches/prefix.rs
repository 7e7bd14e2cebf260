//! Measures what `prefix-aware` adds to a request: the prompt's chain (a skim of the body's top
//! level for its prompt's raw spans, then one hash pass over them in 256-byte blocks), each part
//! beside the fields pass every request makes (`prefix_split_8KB`), and the owner's lookup and
//! record in a model's index of four agents, each holding a few hundred conversations' blocks.
//!
//! On a quiet machine, LTO off (`CARGO_PROFILE_BENCH_LTO=false
//! CARGO_PROFILE_BENCH_CODEGEN_UNITS=16 cargo bench --bench prefix`): the chain of a 3 KB chat
//! 0.73 µs, 8 KB 1.24 µs, 100 KB 5.2 µs; of the 8 KB chat, the fields pass 1.98 µs, the skim
//! 0.62 µs, the hash 0.30 µs (the `serde_json` pass the skim replaced: 1.76 µs); a lookup and
//! record of an 8 KB prompt (32 blocks) in an index of 400 conversations 1.2 µs.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hivenet_router::logic::routing::AgentId;
use hivenet_router::logic::routing::prefix::PrefixIndex;
use hivenet_router::logic::routing::prefix::chain::{Chain, chain_of};
use hivenet_router::wire::http::prompt_parts::PromptParts;

/// A chat turn of `turns` exchanges over a `system_bytes` system prompt, as a client sends it.
fn chat(conversation: usize, system_bytes: usize, turns: usize) -> Vec<u8> {
    let system: String = (0..system_bytes)
        .map(|index| (b'a' + ((index * 7 + conversation * 13) % 26) as u8) as char)
        .collect();
    let mut messages = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
    for turn in 0..turns {
        messages.push(format!(
            r#"{{"role":"user","content":"question {turn}: what does the router do when the store is slow?"}}"#
        ));
        messages.push(format!(
            r#"{{"role":"assistant","content":"answer {turn}: it keeps serving within its share and publishes later."}}"#
        ));
    }
    format!(
        r#"{{"model":"Qwen/Qwen3-32B","stream":true,"max_tokens":256,"messages":[{}]}}"#,
        messages.join(",")
    )
    .into_bytes()
}

fn chain(body: &[u8]) -> Vec<u64> {
    let mut out = Chain::new();
    chain_of(&PromptParts::of(body).bytes(), &mut out);
    out.blocks().to_vec()
}

fn bench_chain(c: &mut Criterion) {
    let mut group = c.benchmark_group("prefix_chain");
    for (name, body) in [
        ("3KB", chat(0, 2_048, 4)),
        ("8KB", chat(0, 6_144, 6)),
        ("100KB", chat(0, 98_000, 6)),
    ] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        let mut out = Chain::new();
        group.bench_function(name, |b| {
            b.iter(|| {
                let parts = PromptParts::of(black_box(&body));
                chain_of(&parts.bytes(), &mut out);
                black_box(out.blocks().len())
            })
        });
    }
    group.finish();
    let mut split = c.benchmark_group("prefix_split_8KB");
    let body = chat(0, 6_144, 6);
    let mut out = Chain::new();
    split.bench_function("fields", |b| {
        b.iter(|| {
            black_box(hivenet_router::wire::http::fields::extract_fields(black_box(&body)).is_ok())
        })
    });
    split.bench_function("parts", |b| {
        b.iter(|| black_box(PromptParts::of(black_box(&body)).bytes()[2].len()))
    });
    let parts = PromptParts::of(&body);
    let bytes = parts.bytes();
    split.bench_function("hash", |b| {
        b.iter(|| {
            chain_of(black_box(&bytes), &mut out);
            black_box(out.blocks().len())
        })
    });
    split.finish();
}

fn bench_index(c: &mut Criterion) {
    // Four agents, 100 conversations each (an 8 KB prompt: 32 blocks), then lookups of a
    // conversation's next turn and its record.
    let mut index = PrefixIndex::new(16_384);
    let chains: Vec<Vec<u64>> = (0..400)
        .map(|conversation| chain(&chat(conversation, 6_144, 6)))
        .collect();
    for (conversation, chain) in chains.iter().enumerate() {
        index.record(AgentId((conversation % 4) as u32), chain);
    }
    let next: Vec<Vec<u64>> = (0..400)
        .map(|conversation| chain(&chat(conversation, 6_144, 7)))
        .collect();
    let mut matches = Vec::new();
    let mut turn = 0;
    c.bench_function("prefix_index/match_and_record_8KB", |b| {
        b.iter(|| {
            let chain = &next[turn % next.len()];
            turn += 1;
            index.matches(black_box(chain), &mut matches);
            let agent = matches.first().map_or(AgentId(0), |(agent, _)| *agent);
            index.record(agent, chain);
            black_box(matches.len())
        })
    });
}

criterion_group!(benches, bench_chain, bench_index);
criterion_main!(benches);

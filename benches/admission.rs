//! Measures one admission decision on the owner shard for a key with RPM, ITPM, OTPM and a daily
//! budget configured (`KeyLimits::admit`), and admit + settle together, and counts heap
//! allocations on the admit path (expected: zero once the key has seen the model).
//!
//! Nothing is asserted here (`tests/limits_allocation.rs` asserts the zero). First run, on 2
//! cores shared with other builds (`-- --warm-up-time 1 --measurement-time 2`): admit 27.6 ns
//! (26.6-28.5), admit + settle 42.1 ns (40.6-43.7), 0 allocations in 100 000 admit + settle.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use hivenet_router::logic::limits::{
    BurstSeconds, Day, Delivery, Estimate, FlatQuota, KeyLimits, KeyQuota, Millis, ModelContext,
    Share, UsedTokens,
};
use hivenet_router::logic::snapshot::ModelId;

/// Counts every allocation in the process (the bench runs single-threaded).
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(pointer, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const DAY: Day = Day(20_000);
const MODEL: ModelContext = ModelContext {
    model: ModelId(7),
    healthy_replicas: 2,
    serverless: true,
};
const ESTIMATE: Estimate = Estimate {
    input_tokens: 1_000,
    max_output_tokens: Some(256),
};

/// Limits high enough that a bench run (about 1 ms of virtual time per iteration) never refuses,
/// so every iteration takes the full admit path through all four buckets.
fn key() -> KeyLimits {
    let quota = KeyQuota::Flat(FlatQuota {
        requests_per_minute: 1_000_000_000,
        tokens_per_day: 1 << 40,
        input_tokens_per_minute: 1_000_000_000,
        output_tokens_per_minute: 1_000_000_000,
    });
    KeyLimits::new(Millis(0), DAY, &quota, BurstSeconds::FULL_MINUTE).unwrap()
}

fn admission(criterion: &mut Criterion) {
    let mut limits = key();
    let mut now = 0u64;
    // Warm: the first serverless request for a model creates its B4 buckets.
    let first = limits
        .admit(Millis(now), DAY, &MODEL, ESTIMATE, Share::Whole)
        .unwrap();
    limits.cancel(first.charge);

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..100_000 {
        now += 1;
        let admitted = limits
            .admit(Millis(now), DAY, &MODEL, ESTIMATE, Share::Whole)
            .unwrap();
        limits.settle(
            Millis(now),
            DAY,
            admitted.charge,
            UsedTokens {
                input_tokens: 900,
                output_tokens: 200,
            },
            Delivery::Streamed,
        );
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    println!("allocations in 100000 admit + settle: {allocations}");

    criterion.bench_function("admit (rpm + itpm + otpm + daily)", |bencher| {
        bencher.iter(|| {
            now += 1;
            let admitted = limits.admit(
                Millis(now),
                DAY,
                black_box(&MODEL),
                black_box(ESTIMATE),
                Share::Whole,
            );
            black_box(admitted.is_ok());
            // Dropped without settling: the bench measures the decision alone.
        })
    });

    let mut limits = key();
    criterion.bench_function("admit + settle", |bencher| {
        bencher.iter(|| {
            now += 1;
            let admitted = limits
                .admit(
                    Millis(now),
                    DAY,
                    black_box(&MODEL),
                    black_box(ESTIMATE),
                    Share::Whole,
                )
                .unwrap();
            black_box(limits.settle(
                Millis(now),
                DAY,
                admitted.charge,
                UsedTokens {
                    input_tokens: 900,
                    output_tokens: 200,
                },
                Delivery::Streamed,
            ));
        })
    });
}

criterion_group!(benches, admission);
criterion_main!(benches);

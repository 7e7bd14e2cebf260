//! Proves the per-key admit and settle path allocates nothing once a key has seen its model.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use hivenet_router::logic::limits::{
    BurstSeconds, Day, Delivery, Estimate, FlatQuota, KeyLimits, KeyQuota, Millis, ModelContext,
    Share, UsedTokens,
};
use hivenet_router::logic::snapshot::ModelId;

/// Counts allocations made by the current thread only, so other test threads do not interfere.
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread-local may be gone while a thread is being torn down.
    let _ = ALLOCATIONS.try_with(|allocations| allocations.set(allocations.get() + 1));
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(pointer, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn admit_and_settle_allocate_nothing() {
    let day = Day(20_000);
    let model = ModelContext {
        model: ModelId(3),
        healthy_replicas: 1,
        serverless: true,
    };
    let estimate = Estimate {
        input_tokens: 500,
        max_output_tokens: Some(100),
    };
    let quota = KeyQuota::Flat(FlatQuota {
        requests_per_minute: 600,
        tokens_per_day: 1_000_000,
        input_tokens_per_minute: 10_000,
        output_tokens_per_minute: 10_000,
    });
    let mut limits = KeyLimits::new(Millis(0), day, &quota, BurstSeconds::FULL_MINUTE).unwrap();
    let first = limits
        .admit(Millis(0), day, &model, estimate, Share::Whole)
        .unwrap();
    limits.cancel(first.charge);

    // The counter sees this thread's allocations.
    let before = ALLOCATIONS.with(Cell::get);
    std::hint::black_box(Vec::<u8>::with_capacity(1));
    assert_eq!(ALLOCATIONS.with(Cell::get) - before, 1);

    let before = ALLOCATIONS.with(Cell::get);
    let mut admitted = 0;
    let mut refused = 0;
    for step in 0..10_000u64 {
        let now = Millis(step * 7);
        match limits.admit(now, day, &model, estimate, Share::Whole) {
            Ok(admission) => {
                admitted += 1;
                let usage = UsedTokens {
                    input_tokens: 450,
                    output_tokens: 80,
                };
                limits.settle(now, day, admission.charge, usage, Delivery::Streamed);
            }
            Err(rejection) => {
                refused += 1;
                std::hint::black_box(rejection);
            }
        }
    }
    let allocations = ALLOCATIONS.with(Cell::get) - before;
    assert!(admitted > 0 && refused > 0, "both paths taken");
    assert_eq!(allocations, 0);
}

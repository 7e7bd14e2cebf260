//! Measures the learning input estimator on the request path: one estimate at admission and one
//! observation at settle, for a model among 32 learned ones.
//!
//! Run: `cargo bench --bench estimator`. First run, on 2 loaded cores: estimate 23 ns, observe
//! 26 ns, both 45 ns (a SipHash map lookup each dominates).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use hivenet_router::logic::admission::estimator::Estimator;
use hivenet_router::logic::snapshot::ModelId;
use hivenet_router::wire::http::prompt::PromptShape;

fn warmed() -> Estimator {
    let mut estimator = Estimator::default();
    for model in 0..32 {
        for _ in 0..10 {
            estimator.observe(ModelId(model), &shape(), 1_000);
        }
    }
    estimator
}

/// A multi-turn chat with tools, as `extract_fields` would measure it.
fn shape() -> PromptShape {
    PromptShape {
        text_bytes: 3_400,
        tools_bytes: 1_900,
        messages: 6,
        images: 0,
    }
}

fn bench(criterion: &mut Criterion) {
    let model = ModelId(17);
    let shape = shape();
    let mut group = criterion.benchmark_group("estimator");
    let estimator = warmed();
    group.bench_function("estimate", |bencher| {
        bencher.iter(|| estimator.estimate(black_box(model), black_box(&shape)))
    });
    let mut estimator = warmed();
    group.bench_function("observe", |bencher| {
        bencher.iter(|| estimator.observe(black_box(model), black_box(&shape), black_box(1_400)))
    });
    let mut estimator = warmed();
    group.bench_function("estimate_then_observe", |bencher| {
        bencher.iter(|| {
            let estimate = estimator.estimate(black_box(model), black_box(&shape));
            estimator.observe(model, &shape, black_box(estimate + 40));
            estimate
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

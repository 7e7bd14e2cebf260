//! The learning input estimate: how many input tokens a request's prompt will cost, learned per
//! model from exact backend usage (seed `admission-control.md`, "One input estimate").
//!
//! Owns one tokens-per-byte ratio per model and the rule that turns a [`PromptShape`] into input
//! tokens. It must not read a clock, do I/O or allocate after construction; the caller (the shard
//! that owns the model) calls it with shapes from [`crate::wire::http::fields::extract_fields`] and
//! exact usage from [`crate::logic::usage`]. The learned state lives in memory only and resets when the
//! router restarts, as the seed specifies.
//!
//! # Key components
//! - [`Estimator::estimate`] (query): `ceil(estimable bytes × ratio) + TOKENS_PER_MESSAGE ×
//!   messages`, where estimable bytes are message text plus raw `tools` JSON.
//! - [`Estimator::observe`] (input): one exact input count updates the model's ratio by an EWMA
//!   of weight [`OBSERVATION_WEIGHT`], the observation clamped to
//!   [[`TOKENS_PER_BYTE_MIN`], [`TOKENS_PER_BYTE_MAX`]].
//! - [`Estimator::forget`] (mutator): drop what was learned for a model, for a model that left
//!   the registry or was redeployed with another tokenizer.
//!
//! # How an observation is derived
//! The per-message overhead is a fixed assumption, not learned. An exact count is split as
//! `exact = overhead + text`: `TOKENS_PER_MESSAGE × messages` is subtracted first (saturating at
//! zero), and the rest divided by the estimable bytes is the observed ratio. Any error in the
//! overhead constant is therefore absorbed by the learned ratio, spread over the request's bytes;
//! where a request has few bytes per message that error dominates its observation, and the clamp
//! bounds the damage. Requests with an image are not observed (their image tokens are not
//! byte-estimable; seed, B1), nor are requests with no estimable bytes (nothing to divide by).
//! Image tokens are not part of [`Estimator::estimate`] either: images are capped by count
//! (`images_max`) and trued up from exact usage.
//!
//! # Where it runs
//! One ratio per model for the whole router (seed: "a separate tokens-per-byte ratio for each
//! model"): the [`Estimator`] of the shard that owns the model learns it (exact usage reaches
//! the owner with the request's slot release), and publishes each new ratio in the model's
//! [`PublishedRatio`], which the routing snapshot hands every shard: any shard estimates a
//! prompt with the same ratio, read without a lock, and every request trains it.
//!
//! # Invariants
//! - Every ratio, learned or starting, is within [`TOKENS_PER_BYTE_MIN`]..=[`TOKENS_PER_BYTE_MAX`];
//!   so one abnormal report moves a ratio by at most `OBSERVATION_WEIGHT × (MAX - MIN)`, and the
//!   next normal reports pull it back geometrically (factor `1 - OBSERVATION_WEIGHT` each).
//! - At most `models_max` models are remembered; learning a new model when full forgets the one
//!   observed longest ago (by observation count, not by a clock). The map is sized at
//!   construction, so neither call allocates.
//! - No method panics, whatever the shape or count: arithmetic saturates and the float to
//!   integer conversion saturates.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::ids::{IdMap, ModelId};
use crate::wire::http::prompt::PromptShape;

/// One model's learned ratio as every shard reads it: written only by the model's owner shard
/// (after its [`Estimator`] learned), read by any shard at admission. A whole `f64` in one
/// atomic: a reader sees the last ratio published or the one before, never a torn value, and
/// needs no ordering with anything else (`Relaxed`).
#[derive(Debug)]
pub struct PublishedRatio(AtomicU64);

impl Default for PublishedRatio {
    /// [`TOKENS_PER_BYTE_START`] until the owner learns.
    fn default() -> Self {
        PublishedRatio(AtomicU64::new(TOKENS_PER_BYTE_START.to_bits()))
    }
}

impl PublishedRatio {
    pub fn tokens_per_byte(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// The owner's new ratio (within the estimator's bounds).
    pub fn publish(&self, tokens_per_byte: f64) {
        debug_assert!((TOKENS_PER_BYTE_MIN..=TOKENS_PER_BYTE_MAX).contains(&tokens_per_byte));
        self.0.store(tokens_per_byte.to_bits(), Ordering::Relaxed);
    }

    /// Input tokens of a request with `shape` at the published ratio (see [`estimate`]).
    pub fn estimate(&self, shape: &PromptShape) -> u64 {
        estimate(self.tokens_per_byte(), shape)
    }
}

/// Input tokens of a request with `shape` at `tokens_per_byte`: `ceil(estimable bytes × ratio)
/// + TOKENS_PER_MESSAGE × messages`. Images add nothing here (see the module docs).
pub fn estimate(tokens_per_byte: f64, shape: &PromptShape) -> u64 {
    let text_tokens = (shape.estimable_bytes() as f64 * tokens_per_byte).ceil();
    // `as` saturates (and the ratio is finite and positive, so the product is never NaN).
    (text_tokens as u64).saturating_add(overhead_tokens(shape))
}

/// Tokens a chat template adds around each message: the role header and the end-of-turn
/// separator. Four sits in the range of common templates — OpenAI's cookbook counts 3 per message
/// (plus 3 to prime the reply), Llama 3's `<|start_header_id|>role<|end_header_id|>\n\n` ...
/// `<|eot_id|>` and ChatML's `<|im_start|>role\n` ... `<|im_end|>\n` are 5 — and it is the
/// simulated engine's constant, so the convergence test measures the ratio alone. It also counts
/// for textless messages (seed: "a small per-message overhead, including for textless
/// messages").
pub const TOKENS_PER_MESSAGE: u64 = 4;

/// The ratio every model starts at: one token per 3.2 bytes (seed).
pub const TOKENS_PER_BYTE_START: f64 = 1.0 / 3.2;

/// Lowest observed ratio accepted (seed): one token per 20 bytes.
pub const TOKENS_PER_BYTE_MIN: f64 = 0.05;

/// Highest observed ratio accepted (seed): one token per byte.
pub const TOKENS_PER_BYTE_MAX: f64 = 1.0;

/// EWMA weight of one new observation (seed).
pub const OBSERVATION_WEIGHT: f64 = 0.2;

/// Default bound on remembered models, the same as the per-key token-rate bound
/// ([`crate::logic::limits::TOKEN_RATE_MODELS_MAX`]): far above the models one router serves.
pub const MODELS_MAX_DEFAULT: usize = 256;

/// What one model has learned.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Learned {
    tokens_per_byte: f64,
    /// Observations that updated the ratio.
    observations: u64,
    /// The estimator's observation counter when this model last learned; the eviction order.
    last_observation: u64,
}

/// What [`Estimator::observe`] did with an exact count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    /// The model's ratio moved to `tokens_per_byte`; `clamped` when the observed ratio was
    /// outside the accepted range and was clamped first.
    Learned { tokens_per_byte: f64, clamped: bool },
    /// The request carried an image: not byte-estimable, not used to train.
    SkippedImages,
    /// The request had no text or tool bytes: no ratio to observe.
    SkippedNoText,
}

/// Learned tokens-per-byte ratios, one per model.
///
/// Call order per request: [`Estimator::estimate`] at admission, then [`Estimator::observe`]
/// with the same shape once the backend reports exact input usage (and only then: an estimate
/// standing in for missing usage must not be observed, it would teach the estimator itself).
#[derive(Debug, Clone)]
pub struct Estimator {
    /// Looked up on every request.
    models: IdMap<ModelId, Learned>,
    models_max: usize,
    /// Observations that updated a ratio, all models; orders models for eviction.
    observations_total: u64,
}

impl Default for Estimator {
    fn default() -> Self {
        Estimator::new(MODELS_MAX_DEFAULT)
    }
}

impl Estimator {
    /// An estimator remembering at most `models_max` models (at least one).
    pub fn new(models_max: usize) -> Estimator {
        let models_max = models_max.max(1);
        Estimator {
            models: IdMap::with_capacity_and_hasher(models_max, Default::default()),
            models_max,
            observations_total: 0,
        }
    }

    /// The ratio `model` is estimated with: learned, or [`TOKENS_PER_BYTE_START`].
    pub fn tokens_per_byte(&self, model: ModelId) -> f64 {
        self.models
            .get(&model)
            .map_or(TOKENS_PER_BYTE_START, |learned| learned.tokens_per_byte)
    }

    /// Observations that have updated `model`'s ratio since it was last forgotten.
    pub fn observations(&self, model: ModelId) -> u64 {
        self.models
            .get(&model)
            .map_or(0, |learned| learned.observations)
    }

    /// Models with a learned ratio.
    pub fn models_learned(&self) -> usize {
        self.models.len()
    }

    /// Input tokens of a request with `shape` for `model`: `ceil(estimable bytes × ratio) +
    /// TOKENS_PER_MESSAGE × messages`. Images add nothing here (see the module docs).
    pub fn estimate(&self, model: ModelId, shape: &PromptShape) -> u64 {
        estimate(self.tokens_per_byte(model), shape)
    }

    /// Learn from the exact input tokens the backend reported for a request with `shape`.
    pub fn observe(
        &mut self,
        model: ModelId,
        shape: &PromptShape,
        exact_input_tokens: u64,
    ) -> Observation {
        if shape.images > 0 {
            return Observation::SkippedImages;
        }
        let bytes = shape.estimable_bytes();
        if bytes == 0 {
            return Observation::SkippedNoText;
        }
        let text_tokens = exact_input_tokens.saturating_sub(overhead_tokens(shape));
        let observed = text_tokens as f64 / bytes as f64;
        let clamped = !(TOKENS_PER_BYTE_MIN..=TOKENS_PER_BYTE_MAX).contains(&observed);
        let observed = observed.clamp(TOKENS_PER_BYTE_MIN, TOKENS_PER_BYTE_MAX);

        self.observations_total = self.observations_total.saturating_add(1);
        let now = self.observations_total;
        let learned = match self.models.get_mut(&model) {
            Some(learned) => learned,
            None => {
                if self.models.len() >= self.models_max {
                    self.evict_oldest();
                }
                self.models.entry(model).or_insert(Learned {
                    tokens_per_byte: TOKENS_PER_BYTE_START,
                    observations: 0,
                    last_observation: now,
                })
            }
        };
        let updated =
            (1.0 - OBSERVATION_WEIGHT) * learned.tokens_per_byte + OBSERVATION_WEIGHT * observed;
        // A convex combination of two in-range values; the clamp only guards the last ulp.
        learned.tokens_per_byte = updated.clamp(TOKENS_PER_BYTE_MIN, TOKENS_PER_BYTE_MAX);
        learned.observations = learned.observations.saturating_add(1);
        learned.last_observation = now;
        Observation::Learned {
            tokens_per_byte: learned.tokens_per_byte,
            clamped,
        }
    }

    /// Forget what `model` learned; it starts again from [`TOKENS_PER_BYTE_START`].
    pub fn forget(&mut self, model: ModelId) {
        self.models.remove(&model);
    }

    /// Forget every model for which `keep` is false (for example, models no longer in the
    /// routing snapshot).
    pub fn retain(&mut self, mut keep: impl FnMut(ModelId) -> bool) {
        self.models.retain(|&model, _| keep(model));
    }

    /// Drop the model that learned longest ago. Linear in `models_max`, and only run when a new
    /// model arrives at a full map.
    fn evict_oldest(&mut self) {
        let oldest = self
            .models
            .iter()
            .min_by_key(|(_, learned)| learned.last_observation)
            .map(|(&model, _)| model);
        if let Some(model) = oldest {
            self.models.remove(&model);
        }
    }
}

fn overhead_tokens(shape: &PromptShape) -> u64 {
    TOKENS_PER_MESSAGE.saturating_mul(u64::from(shape.messages))
}

#[cfg(test)]
mod convergence_tests;

#[cfg(test)]
mod tests {
    //! Proves the starting ratio, the exact EWMA step, clamping at both ends, that images and
    //! textless requests never train, that one abnormal report cannot poison a ratio, that models
    //! learn apart within a bounded map, and (proptest) that every ratio stays within bounds.
    use super::*;

    const MODEL: ModelId = ModelId(7);

    fn text(bytes: u64, messages: u32) -> PromptShape {
        PromptShape {
            text_bytes: bytes,
            tools_bytes: 0,
            messages,
            images: 0,
        }
    }

    fn assert_close(actual: f64, expected: f64) {
        assert!(
            (actual - expected).abs() < 1e-12,
            "{actual} is not {expected}"
        );
    }

    #[test]
    fn starts_at_one_token_per_3_2_bytes() {
        let estimator = Estimator::default();
        assert_eq!(estimator.tokens_per_byte(MODEL), 1.0 / 3.2);
        assert_eq!(estimator.observations(MODEL), 0);
        // 320 bytes are 100 tokens, plus 4 per message; textless messages still cost 4.
        assert_eq!(estimator.estimate(MODEL, &text(320, 2)), 100 + 8);
        assert_eq!(estimator.estimate(MODEL, &text(0, 3)), 12);
        assert_eq!(estimator.estimate(MODEL, &PromptShape::default()), 0);
        // Rounds up: one byte is one token.
        assert_eq!(estimator.estimate(MODEL, &text(1, 0)), 1);
    }

    #[test]
    fn tools_bytes_count_as_text_and_images_add_nothing() {
        let estimator = Estimator::default();
        let shape = PromptShape {
            text_bytes: 160,
            tools_bytes: 160,
            messages: 1,
            images: 3,
        };
        assert_eq!(estimator.estimate(MODEL, &shape), 100 + 4);
    }

    #[test]
    fn one_ewma_step_is_exact() {
        let mut estimator = Estimator::default();
        // 1000 bytes in 2 messages, exact 508: (508 - 8) / 1000 = 0.5 observed.
        let observed = estimator.observe(MODEL, &text(1000, 2), 508);
        let expected = 0.8 * (1.0 / 3.2) + 0.2 * 0.5;
        assert_close(expected, 0.35);
        assert_eq!(
            observed,
            Observation::Learned {
                tokens_per_byte: estimator.tokens_per_byte(MODEL),
                clamped: false
            }
        );
        assert_close(estimator.tokens_per_byte(MODEL), expected);
        assert_eq!(estimator.observations(MODEL), 1);
        // A second step from there.
        estimator.observe(MODEL, &text(1000, 2), 258);
        assert_close(estimator.tokens_per_byte(MODEL), 0.8 * 0.35 + 0.2 * 0.25);
        // 0.33 × 1000 rounds up; float noise may add the one token `ceil` errs by at most.
        let estimate = estimator.estimate(MODEL, &text(1000, 1));
        assert!((334..=335).contains(&estimate), "{estimate}");
    }

    #[test]
    fn observations_are_clamped_at_both_ends() {
        let mut high = Estimator::default();
        // 100 bytes billed 10 000 tokens: observed 100 tokens per byte, clamped to 1.0.
        let outcome = high.observe(MODEL, &text(100, 0), 10_000);
        assert!(matches!(
            outcome,
            Observation::Learned { clamped: true, .. }
        ));
        assert_close(high.tokens_per_byte(MODEL), 0.8 / 3.2 + 0.2 * 1.0);

        let mut low = Estimator::default();
        // Fewer tokens than the message overhead: text tokens saturate at 0, clamped to 0.05.
        let outcome = low.observe(MODEL, &text(100, 5), 3);
        assert!(matches!(
            outcome,
            Observation::Learned { clamped: true, .. }
        ));
        assert_close(low.tokens_per_byte(MODEL), 0.8 / 3.2 + 0.2 * 0.05);

        // At the bounds exactly: not clamped.
        let mut edge = Estimator::default();
        let outcome = edge.observe(MODEL, &text(100, 0), 100);
        assert!(matches!(
            outcome,
            Observation::Learned { clamped: false, .. }
        ));
        let outcome = edge.observe(MODEL, &text(100, 0), 5);
        assert!(matches!(
            outcome,
            Observation::Learned { clamped: false, .. }
        ));

        // A long run of extremes reaches the bound and stays on it.
        for _ in 0..500 {
            high.observe(MODEL, &text(1, 0), u64::MAX);
            low.observe(MODEL, &text(u64::MAX, u32::MAX), 0);
        }
        assert_close(high.tokens_per_byte(MODEL), TOKENS_PER_BYTE_MAX);
        assert_close(low.tokens_per_byte(MODEL), TOKENS_PER_BYTE_MIN);
        assert!(high.tokens_per_byte(MODEL) <= TOKENS_PER_BYTE_MAX);
        assert!(low.tokens_per_byte(MODEL) >= TOKENS_PER_BYTE_MIN);
    }

    #[test]
    fn images_and_textless_requests_never_train() {
        let mut estimator = Estimator::default();
        let with_image = PromptShape {
            text_bytes: 1000,
            tools_bytes: 0,
            messages: 1,
            images: 1,
        };
        assert_eq!(
            estimator.observe(MODEL, &with_image, 2000),
            Observation::SkippedImages
        );
        assert_eq!(
            estimator.observe(MODEL, &text(0, 4), 16),
            Observation::SkippedNoText
        );
        assert_eq!(estimator.tokens_per_byte(MODEL), TOKENS_PER_BYTE_START);
        assert_eq!(estimator.observations(MODEL), 0);
        assert_eq!(estimator.models_learned(), 0);
    }

    #[test]
    fn one_abnormal_report_cannot_poison() {
        let mut estimator = Estimator::default();
        let shape = text(4000, 2);
        for _ in 0..200 {
            estimator.observe(MODEL, &shape, 1008); // 0.25 tokens per byte
        }
        assert_close(estimator.tokens_per_byte(MODEL), 0.25);
        estimator.observe(MODEL, &shape, u64::MAX);
        // At most one weight of the distance to the upper bound.
        assert_close(estimator.tokens_per_byte(MODEL), 0.8 * 0.25 + 0.2 * 1.0);
        let after_abnormal = estimator.estimate(MODEL, &shape);
        assert!(
            (1608..=1609).contains(&after_abnormal),
            "0.4 tokens per byte: {after_abnormal}"
        );
        // Twenty normal reports bring the estimate back within 1 %.
        for _ in 0..20 {
            estimator.observe(MODEL, &shape, 1008);
        }
        let estimate = estimator.estimate(MODEL, &shape);
        assert!(estimate.abs_diff(1008) * 100 <= 1008, "{estimate} vs 1008");
    }

    #[test]
    fn models_learn_apart_and_forget() {
        let mut estimator = Estimator::default();
        let (a, b) = (ModelId(1), ModelId(2));
        for _ in 0..200 {
            estimator.observe(a, &text(1000, 0), 250);
            estimator.observe(b, &text(1000, 0), 600);
        }
        assert_close(estimator.tokens_per_byte(a), 0.25);
        assert_close(estimator.tokens_per_byte(b), 0.6);
        assert_eq!(estimator.models_learned(), 2);
        estimator.forget(a);
        assert_eq!(estimator.tokens_per_byte(a), TOKENS_PER_BYTE_START);
        assert_eq!(estimator.observations(a), 0);
        assert_close(estimator.tokens_per_byte(b), 0.6);
        estimator.retain(|model| model != b);
        assert_eq!(estimator.models_learned(), 0);
    }

    #[test]
    fn a_full_map_forgets_the_model_observed_longest_ago() {
        let mut estimator = Estimator::new(2);
        let shape = text(100, 0);
        estimator.observe(ModelId(1), &shape, 50);
        estimator.observe(ModelId(2), &shape, 50);
        estimator.observe(ModelId(1), &shape, 50);
        // Model 2 learned longest ago; model 3 takes its place.
        estimator.observe(ModelId(3), &shape, 50);
        assert_eq!(estimator.models_learned(), 2);
        assert_eq!(estimator.observations(ModelId(1)), 2);
        assert_eq!(estimator.observations(ModelId(2)), 0);
        assert_eq!(estimator.observations(ModelId(3)), 1);
        assert_eq!(estimator.tokens_per_byte(ModelId(2)), TOKENS_PER_BYTE_START);
        // A zero bound still remembers one model.
        let mut tiny = Estimator::new(0);
        tiny.observe(ModelId(1), &shape, 50);
        tiny.observe(ModelId(2), &shape, 50);
        assert_eq!(tiny.models_learned(), 1);
    }

    #[test]
    fn extreme_shapes_do_not_panic() {
        let mut estimator = Estimator::default();
        let huge = PromptShape {
            text_bytes: u64::MAX,
            tools_bytes: u64::MAX,
            messages: u32::MAX,
            images: 0,
        };
        // Bytes saturate at u64::MAX, times the starting ratio.
        assert!(estimator.estimate(MODEL, &huge) >= u64::MAX / 4);
        estimator.observe(MODEL, &huge, u64::MAX);
        estimator.observe(MODEL, &huge, 0);
        assert!(estimator.estimate(MODEL, &huge) > 0);
    }

    proptest::proptest! {
        /// Whatever is observed, in whatever order, every ratio stays within the accepted range
        /// and every estimate is at least the message overhead.
        #[test]
        fn ratio_always_stays_within_bounds(
            steps in proptest::collection::vec(
                (0u32..4, proptest::prelude::any::<u64>(), 0u64..1 << 40, 0u32..300, 0u32..2),
                1..200),
        ) {
            let mut estimator = Estimator::new(3);
            for (model, exact, bytes, messages, images) in steps {
                let model = ModelId(model);
                let shape = PromptShape {
                    text_bytes: bytes / 2,
                    tools_bytes: bytes - bytes / 2,
                    messages,
                    images,
                };
                estimator.observe(model, &shape, exact);
                let ratio = estimator.tokens_per_byte(model);
                proptest::prop_assert!(
                    (TOKENS_PER_BYTE_MIN..=TOKENS_PER_BYTE_MAX).contains(&ratio),
                    "ratio {}", ratio
                );
                proptest::prop_assert!(
                    estimator.estimate(model, &shape) >= TOKENS_PER_MESSAGE * u64::from(messages)
                );
                proptest::prop_assert!(estimator.models_learned() <= 3);
            }
        }
    }
}

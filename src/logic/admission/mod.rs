//! Admission control (seed `admission-control.md`): the gates an LLM request passes before it
//! may wait for an agent slot.
//!
//! - [`occupancy`]: B2 pool occupancy and the B4 per-key occupancy share, on the model's owner.
//! - [`estimator`]: the one input estimate, learning a tokens-per-byte ratio per model.
//! - [`derive`]: the `derive-key-defaults` subcommand's suggested B4 values.

pub mod derive;
pub mod estimator;
pub mod occupancy;

use crate::logic::policy::{Mode, ModelPolicy};

/// Whether B4 (key occupancy share, input and output tokens per minute) runs for the model.
pub fn is_serverless(policy: &ModelPolicy) -> bool {
    policy.mode == Mode::Serverless
}

/// B1 has a cap to check.
pub fn caps_requests(policy: &ModelPolicy) -> bool {
    policy.max_input_tokens > 0 || policy.images_max > 0
}

/// B3 or B2 has something to check on the model's owner (B4's share is the key's part).
pub fn gates_pool(policy: &ModelPolicy) -> bool {
    policy.admit_budget_tokens > 0 || policy.max_inflight > 0 || !policy.shed_if.is_empty()
}

/// B1: the message of a `400 input_too_long`, if the request is over a cap.
pub fn request_caps(policy: &ModelPolicy, input_tokens: u64, images: u64) -> Option<String> {
    if policy.max_input_tokens > 0 && input_tokens > policy.max_input_tokens {
        return Some(format!(
            "input is {input_tokens} tokens, over the model limit of {}",
            policy.max_input_tokens
        ));
    }
    if policy.images_max > 0 && images > u64::from(policy.images_max) {
        return Some(format!(
            "request has {images} images, over the model limit of {}",
            policy.images_max
        ));
    }
    None
}

/// How the policy routed a request, for the `hivenet_policy_*_total{model}` counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyOutcome {
    /// Forwarded by the primary step (`routing_policy`).
    PrimaryRouted,
    /// Forwarded by a local fallback step.
    FallbackRouted,
    /// Served by the external provider fallback.
    ProviderFallback,
    /// The local chain was exhausted and no successful result followed.
    Exhausted,
}

impl PolicyOutcome {
    pub const ALL: [PolicyOutcome; 4] = [
        PolicyOutcome::PrimaryRouted,
        PolicyOutcome::FallbackRouted,
        PolicyOutcome::ProviderFallback,
        PolicyOutcome::Exhausted,
    ];

    pub fn metric(self) -> &'static str {
        match self {
            PolicyOutcome::PrimaryRouted => "hivenet_policy_primary_routed_total",
            PolicyOutcome::FallbackRouted => "hivenet_policy_fallback_routed_total",
            PolicyOutcome::ProviderFallback => "hivenet_policy_provider_fallback_total",
            PolicyOutcome::Exhausted => "hivenet_policy_exhausted_total",
        }
    }
}

/// Which gate refused, as the `reason` label of `hivenet_admission_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    B1,
    B2,
    B3,
    B4Occupancy,
    B4Itpm,
    B4Otpm,
    B4Rpm,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::B1 => "b1",
            Reason::B2 => "b2",
            Reason::B3 => "b3",
            Reason::B4Occupancy => "b4_occupancy",
            Reason::B4Itpm => "b4_itpm",
            Reason::B4Otpm => "b4_otpm",
            Reason::B4Rpm => "b4_rpm",
        }
    }

    /// The reason a per-key limit refusal counts under, if it is an admission gate (the daily
    /// budget has its own metrics).
    pub fn of_quota(kind: crate::logic::limits::RejectionKind) -> Option<Reason> {
        use crate::logic::limits::RejectionKind;
        match kind {
            RejectionKind::RequestRate => Some(Reason::B4Rpm),
            RejectionKind::InputTokenRate => Some(Reason::B4Itpm),
            RejectionKind::OutputTokenRate => Some(Reason::B4Otpm),
            RejectionKind::ModelNotInQuota
            | RejectionKind::DailyTokens
            | RejectionKind::DailyTokensForMaxOutput => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_input_tokens: u64, images_max: u32) -> ModelPolicy {
        let context = crate::logic::policy::PolicyContext::default();
        ModelPolicy {
            max_input_tokens,
            images_max,
            ..ModelPolicy::built_in(&context)
        }
    }

    #[test]
    fn request_caps_message_matches_the_seed() {
        let capped = policy(131072, 2);
        assert_eq!(
            request_caps(&capped, 140000, 0).as_deref(),
            Some("input is 140000 tokens, over the model limit of 131072")
        );
        assert_eq!(request_caps(&capped, 131072, 2), None);
        assert!(request_caps(&capped, 10, 3).unwrap().contains("3 images"));
        assert_eq!(request_caps(&policy(0, 0), u64::MAX, 99), None);
        assert!(!caps_requests(&policy(0, 0)) && caps_requests(&capped));
    }
}

//! Admission control (seed `admission-control.md`): the gates an LLM request passes before it
//! may wait for an agent slot.
//!
//! - [`occupancy`]: B2 pool occupancy and the B4 per-key occupancy share, on the model's owner.
//! - [`derive`]: the `derive-key-defaults` subcommand's suggested B4 values.

pub mod derive;
pub mod occupancy;

use std::sync::Arc;

/// The admission part of one model's effective policy, as the request path reads it (built by
/// the control core from the policy files into every routing snapshot). `0` disables a limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionPolicy {
    /// `mode: serverless`: B4 (key occupancy share, input and output tokens per minute) runs.
    pub serverless: bool,
    pub max_input_tokens: u64,
    pub images_max: u64,
    /// Per replica.
    pub admit_budget_tokens: u64,
    /// Per replica.
    pub max_inflight: u64,
}

impl AdmissionPolicy {
    /// No policy: every admission gate off.
    pub fn none() -> Arc<AdmissionPolicy> {
        Arc::new(AdmissionPolicy::default())
    }

    /// B1 has a cap to check.
    pub fn caps_requests(&self) -> bool {
        self.max_input_tokens > 0 || self.images_max > 0
    }

    /// B2 or B3 has something to check on the model's owner (B4's share is the key's part).
    pub fn gates_pool(&self) -> bool {
        self.admit_budget_tokens > 0 || self.max_inflight > 0
    }

    /// B1: the message of a `400 input_too_long`, if the request is over a cap.
    pub fn request_caps(&self, input_tokens: u64, images: u64) -> Option<String> {
        if self.max_input_tokens > 0 && input_tokens > self.max_input_tokens {
            return Some(format!(
                "input is {input_tokens} tokens, over the model limit of {}",
                self.max_input_tokens
            ));
        }
        if self.images_max > 0 && images > self.images_max {
            return Some(format!(
                "request has {images} images, over the model limit of {}",
                self.images_max
            ));
        }
        None
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
    pub fn of_quota(kind: crate::limits::RejectionKind) -> Option<Reason> {
        use crate::limits::RejectionKind;
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

    #[test]
    fn request_caps_message_matches_the_seed() {
        let policy = AdmissionPolicy {
            max_input_tokens: 131072,
            images_max: 2,
            ..AdmissionPolicy::default()
        };
        assert_eq!(
            policy.request_caps(140000, 0).as_deref(),
            Some("input is 140000 tokens, over the model limit of 131072")
        );
        assert_eq!(policy.request_caps(131072, 2), None);
        assert!(policy.request_caps(10, 3).unwrap().contains("3 images"));
        assert_eq!(AdmissionPolicy::default().request_caps(u64::MAX, 99), None);
    }
}

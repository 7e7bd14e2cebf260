//! Static matching (`match`, gate 4 of a routing step): filters agents by the metadata they
//! registered.
//!
//! Rules (policy reference, "Static matching", "Match logic", "Tag logic"): every non-empty
//! condition must hold; comparisons are exact and case-sensitive; every tag the policy lists must
//! be among the agent's tags, which may carry more. An empty `match` (or none) matches every
//! agent; model, health, capability, previous failures and capacity are the caller's gates.
//!
//! Invariants of a compiled [`Match`]: no condition holds an empty string, and tags are
//! deduplicated, so `is_empty` means "matches everything".

/// What an agent registered, borrowed from wherever the caller keeps it. An empty string is
/// "not reported", which fails any condition on that field.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentFacts<'a> {
    /// `--region`.
    pub region: &'a str,
    /// `--engine`: `vllm`, `ollama`, `sglang`, `llamacpp`, `infinity`, `custom`.
    pub engine: &'a str,
    /// `--tags`, split on commas.
    pub tags: &'a [String],
    /// `--organization`.
    pub organization: &'a str,
    /// `--machine`.
    pub machine: &'a str,
    /// `--gpu-model` or detected metadata.
    pub gpu_model: &'a str,
}

/// The field of a `match` that an agent failed, for diagnostics such as
/// `gate[4] match [engine(got="",want="vllm")=2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchField {
    Region,
    Engine,
    Tags,
    Organization,
    Machine,
    GpuModel,
}

impl MatchField {
    pub fn name(self) -> &'static str {
        match self {
            MatchField::Region => "region",
            MatchField::Engine => "engine",
            MatchField::Tags => "tags",
            MatchField::Organization => "organization",
            MatchField::Machine => "machine",
            MatchField::GpuModel => "gpu_model",
        }
    }
}

/// The compiled `match` of one routing step. `None`: no condition on that field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub region: Option<Box<str>>,
    pub engine: Option<Box<str>>,
    /// Every one must be on the agent.
    pub tags: Box<[Box<str>]>,
    pub organization: Option<Box<str>>,
    pub machine: Option<Box<str>>,
    pub gpu_model: Option<Box<str>>,
}

impl Match {
    /// `match: {}`: every agent.
    pub fn any() -> Match {
        Match::default()
    }

    pub fn is_empty(&self) -> bool {
        self.condition_count() == 0
    }

    fn condition_count(&self) -> usize {
        [
            &self.region,
            &self.engine,
            &self.organization,
            &self.machine,
            &self.gpu_model,
        ]
        .iter()
        .filter(|field| field.is_some())
        .count()
            + self.tags.len()
    }

    /// Whether the agent satisfies every condition. Allocates nothing.
    pub fn matches(&self, facts: &AgentFacts<'_>) -> bool {
        self.first_mismatch(facts).is_none()
    }

    /// The first condition the agent fails, in the reference's field order.
    pub fn first_mismatch(&self, facts: &AgentFacts<'_>) -> Option<MatchField> {
        let differs =
            |want: &Option<Box<str>>, got: &str| want.as_deref().is_some_and(|want| want != got);
        if differs(&self.region, facts.region) {
            return Some(MatchField::Region);
        }
        if differs(&self.engine, facts.engine) {
            return Some(MatchField::Engine);
        }
        if !self
            .tags
            .iter()
            .all(|tag| facts.tags.iter().any(|have| have.as_str() == &**tag))
        {
            return Some(MatchField::Tags);
        }
        if differs(&self.organization, facts.organization) {
            return Some(MatchField::Organization);
        }
        if differs(&self.machine, facts.machine) {
            return Some(MatchField::Machine);
        }
        if differs(&self.gpu_model, facts.gpu_model) {
            return Some(MatchField::GpuModel);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> Option<Box<str>> {
        Some(value.into())
    }

    #[test]
    fn every_condition_must_hold_exactly() {
        let policy = Match {
            region: text("EU-France"),
            engine: text("vllm"),
            ..Match::any()
        };
        let tags: Vec<String> = Vec::new();
        let agent = AgentFacts {
            region: "EU-France",
            engine: "vllm",
            tags: &tags,
            ..AgentFacts::default()
        };
        assert!(policy.matches(&agent));
        // Case-sensitive, and no prefix matching.
        for region in ["eu-france", "EU", ""] {
            let other = AgentFacts { region, ..agent };
            assert_eq!(policy.first_mismatch(&other), Some(MatchField::Region));
        }
        let sglang = AgentFacts {
            engine: "sglang",
            ..agent
        };
        assert_eq!(policy.first_mismatch(&sglang), Some(MatchField::Engine));
    }

    #[test]
    fn every_listed_tag_must_be_present_and_extra_tags_are_fine() {
        let policy = Match {
            tags: vec!["production".into(), "high-memory".into()].into_boxed_slice(),
            ..Match::any()
        };
        let all: Vec<String> = ["production", "high-memory", "a100"]
            .map(String::from)
            .to_vec();
        let some: Vec<String> = vec!["production".to_owned()];
        assert!(policy.matches(&AgentFacts {
            tags: &all,
            ..AgentFacts::default()
        }));
        assert_eq!(
            policy.first_mismatch(&AgentFacts {
                tags: &some,
                ..AgentFacts::default()
            }),
            Some(MatchField::Tags)
        );
    }

    #[test]
    fn empty_match_accepts_every_agent() {
        let policy = Match::any();
        assert!(policy.is_empty());
        assert!(policy.matches(&AgentFacts::default()));
        let full = Match {
            organization: text("ml-team"),
            machine: text("gpu-worker-1"),
            gpu_model: text("RTX4090"),
            ..Match::any()
        };
        assert!(!full.is_empty());
        let agent = AgentFacts {
            organization: "ml-team",
            machine: "gpu-worker-1",
            gpu_model: "RTX4090",
            ..AgentFacts::default()
        };
        assert!(full.matches(&agent));
        assert_eq!(
            full.first_mismatch(&AgentFacts {
                gpu_model: "A100",
                ..agent
            }),
            Some(MatchField::GpuModel)
        );
    }
}

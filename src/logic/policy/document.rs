//! One policy document as written (YAML file or admin `PUT` body), and as `GET /admin/policy*`
//! shows it (JSON). The shapes follow `routing-policy-yaml-reference.mdx` field for field.
//!
//! Owns: parsing text into a [`PolicyDocument`] with unknown fields refused (the parser's message
//! names the field path, line and column), duplicate gate metrics refused, and serialising a
//! document back with omitted fields left out, so `GET` output can be sent back with `PUT`.
//!
//! Must not: judge values. Numbers are read as signed integers and strings as strings so that
//! `compile` can refuse a negative limit or an unknown mode with a message naming the field,
//! rather than a type error from the parser.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The whole document. Every field is optional here; `compile` decides what is required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// Models a named document applies to; ignored for a global policy.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub models: Vec<String>,
    /// `reserved` (default, also for an empty value) or `serverless`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// B1 cap on the learned prompt estimate, tokens per request; `0` or omitted disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<i64>,
    /// B1 cap on images per request; `0` or omitted disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_max: Option<i64>,
    /// B2 token-weighted occupancy per healthy replica, tokens; `0` or omitted disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit_budget_tokens: Option<i64>,
    /// B2 in-flight request backstop per healthy replica; `0` or omitted disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<i64>,
    /// B3 pool-pressure thresholds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shed_if: Option<GatesDocument>,
    /// The primary routing step. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_policy: Option<PrimaryStepDocument>,
    /// Ordered local fallback steps.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub fallback_chain: Vec<FallbackStepDocument>,
    /// The external provider tried after every local step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_provider: Option<ProviderDocument>,
}

/// `routing_policy`: a step without a `name` (it is always `routing_policy`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrimaryStepDocument {
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub filter: Option<MatchDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_if: Option<GatesDocument>,
    /// Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// `0`, negative or omitted: `--max-tries-per-step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tries: Option<i64>,
}

/// One `fallback_chain` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackStepDocument {
    /// Label for logs and metrics; omitted: `fallback_chain[i]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub filter: Option<MatchDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_if: Option<GatesDocument>,
    /// Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tries: Option<i64>,
}

/// `match`: static metadata filters. An omitted or empty field is no condition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organization: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
}

/// `exclude_if` or `shed_if`: metric name → operators, in file order. Metric names are checked by
/// `compile` (so an unknown one gets the list of known ones); a metric named twice is refused
/// here, since a YAML map would otherwise silently keep the last.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatesDocument(pub Vec<(String, ThresholdDocument)>);

/// The operators of one metric; exactly one must be set (checked by `compile`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThresholdDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gt: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gte: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lt: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lte: Option<f64>,
}

/// `fallback_provider`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderDocument {
    /// `openai` or `anthropic`. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Model sent to the provider. Required, non-empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Why text is not a policy document: malformed YAML, an unknown field, a wrong type, a
/// duplicated metric. The message comes from the parser and names the field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub message: String,
    /// 1-based, when the parser knows it.
    pub line: Option<usize>,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl PolicyDocument {
    /// Parses YAML (JSON is YAML too). An empty text is an empty document, which `compile` then
    /// refuses for its missing `routing_policy`.
    pub fn from_yaml(text: &str) -> Result<PolicyDocument, ParseError> {
        if text.trim().is_empty() {
            return Ok(PolicyDocument::default());
        }
        // Shape limits first: nesting and alias expansion (`doc_guard`).
        crate::base::doc_guard::from_yaml(text).map_err(|error| ParseError {
            line: error.line,
            message: error.message,
        })
    }

    /// The built-in policy used when nothing is configured (policy reference, "Global policy
    /// file"): match every agent, `least-loaded`, the router-wide forward budget.
    pub fn built_in() -> PolicyDocument {
        PolicyDocument {
            routing_policy: Some(PrimaryStepDocument {
                filter: Some(MatchDocument::default()),
                strategy: Some("least-loaded".to_owned()),
                ..PrimaryStepDocument::default()
            }),
            ..PolicyDocument::default()
        }
    }
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

impl Serialize for GatesDocument {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (metric, threshold) in &self.0 {
            map.serialize_entry(metric, threshold)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for GatesDocument {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct GatesVisitor;

        impl<'de> Visitor<'de> for GatesVisitor {
            type Value = GatesDocument;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a map of metric names to one comparison, e.g. success_rate: {lt: 0.95}",
                )
            }

            // `exclude_if:` with nothing under it: no rules.
            fn visit_unit<E: de::Error>(self) -> Result<GatesDocument, E> {
                Ok(GatesDocument::default())
            }

            fn visit_none<E: de::Error>(self) -> Result<GatesDocument, E> {
                Ok(GatesDocument::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GatesDocument, A::Error> {
                let mut rules: Vec<(String, ThresholdDocument)> = Vec::new();
                let mut seen: BTreeMap<String, ()> = BTreeMap::new();
                while let Some(metric) = map.next_key::<String>()? {
                    if seen.insert(metric.clone(), ()).is_some() {
                        return Err(de::Error::custom(format!(
                            "metric `{metric}` is listed twice; give each metric one rule"
                        )));
                    }
                    let threshold = map
                        .next_value::<Option<ThresholdDocument>>()?
                        .unwrap_or_default();
                    rules.push((metric, threshold));
                }
                Ok(GatesDocument(rules))
            }
        }

        deserializer.deserialize_any(GatesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_example_parses() {
        let text = r#"
models:
  - meta-llama/Llama-3.1-8B-Instruct
mode: reserved
max_input_tokens: 131072
images_max: 8
admit_budget_tokens: 262144
max_inflight: 16
shed_if:
  kv_cache_utilization:
    gt: 0.90
  waiting_requests:
    gt: 20
routing_policy:
  match:
    region: EU-France
    engine: vllm
    tags:
      - production
  exclude_if:
    kv_cache_utilization:
      gt: 0.90
    success_rate:
      lt: 0.95
  strategy: least-loaded
  max_tries: 3
fallback_chain:
  - name: any-vllm-region
    match:
      engine: vllm
    exclude_if:
      success_rate:
        lt: 0.9
    strategy: least-loaded
    max_tries: 2
fallback_provider:
  engine: openai
  model: gpt-4o-mini
"#;
        let document = PolicyDocument::from_yaml(text).unwrap();
        assert_eq!(document.models, ["meta-llama/Llama-3.1-8B-Instruct"]);
        assert_eq!(document.max_inflight, Some(16));
        let primary = document.routing_policy.as_ref().unwrap();
        let exclude = &primary.exclude_if.as_ref().unwrap().0;
        assert_eq!(exclude[0].0, "kv_cache_utilization");
        assert_eq!(exclude[0].1.gt, Some(0.90));
        assert_eq!(exclude[1].0, "success_rate");
        assert_eq!(document.fallback_chain.len(), 1);
        assert_eq!(
            document
                .fallback_provider
                .as_ref()
                .unwrap()
                .engine
                .as_deref(),
            Some("openai")
        );
        // JSON out, YAML (JSON) back in: the same document.
        let json = serde_json::to_string(&document).unwrap();
        assert_eq!(PolicyDocument::from_yaml(&json).unwrap(), document);
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let error = PolicyDocument::from_yaml(
            "routing_policy:\n  strategy: least-loaded\n  stratgy: least-loaded\n",
        )
        .unwrap_err();
        assert!(error.message.contains("routing_policy"), "{error}");
        assert!(error.message.contains("stratgy"), "{error}");
        assert_eq!(error.line, Some(3));

        // A primary step has no name.
        let error =
            PolicyDocument::from_yaml("routing_policy:\n  name: x\n  strategy: least-loaded\n")
                .unwrap_err();
        assert!(error.message.contains("`name`"), "{error}");

        let error = PolicyDocument::from_yaml("fallback_chain:\n  - strategy: a\n    region: eu\n")
            .unwrap_err();
        assert!(error.message.contains("fallback_chain[0]"), "{error}");
    }

    #[test]
    fn unknown_operators_and_duplicate_metrics_are_refused() {
        let error = PolicyDocument::from_yaml(
            "routing_policy:\n  exclude_if:\n    success_rate:\n      eq: 0.9\n",
        )
        .unwrap_err();
        assert!(
            error
                .message
                .contains("routing_policy.exclude_if.success_rate"),
            "{error}"
        );
        assert!(error.message.contains("`eq`"), "{error}");

        let error = PolicyDocument::from_yaml(
            "routing_policy:\n  exclude_if:\n    srtt: {gt: 1}\n    srtt: {gt: 2}\n",
        )
        .unwrap_err();
        assert!(error.message.contains("listed twice"), "{error}");
    }

    #[test]
    fn malformed_yaml_and_wrong_types_are_refused() {
        assert!(PolicyDocument::from_yaml("routing_policy: [unclosed").is_err());
        assert!(PolicyDocument::from_yaml("routing_policy:\n\tstrategy: x\n").is_err());
        assert!(PolicyDocument::from_yaml("- a list\n").is_err());
        let error = PolicyDocument::from_yaml("max_inflight: 1.5\n").unwrap_err();
        assert!(error.message.contains("max_inflight"), "{error}");
    }

    #[test]
    fn empty_blocks_read_as_nothing() {
        let document = PolicyDocument::from_yaml(
            "models:\nrouting_policy:\n  match:\n  exclude_if:\n  strategy: least-loaded\nfallback_chain:\n",
        )
        .unwrap();
        assert!(document.models.is_empty());
        assert!(document.fallback_chain.is_empty());
        let primary = document.routing_policy.unwrap();
        assert_eq!(primary.filter, None);
        assert!(primary.exclude_if.unwrap_or_default().0.is_empty());
        assert_eq!(
            PolicyDocument::from_yaml("  \n").unwrap(),
            PolicyDocument::default()
        );
    }
}

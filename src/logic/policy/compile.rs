//! Validation of one [`PolicyDocument`] into the plain, cheap-to-query [`ModelPolicy`] the
//! request path reads.
//!
//! Owns: every value rule of `routing-policy-yaml-reference.mdx` (and the admission seed's
//! "Configure a policy"): negative limits refused, `mode` only `reserved`/`serverless`, known
//! metric names only (and only `kv_cache_utilization`/`waiting_requests` in `shed_if`), exactly
//! one operator per metric, a strategy on every step and only the implemented ones, a
//! complete `fallback_provider` whose credential is configured, `models` on named documents.
//!
//! Must not: read files, the environment or the clock; the caller passes text, an origin label
//! for messages and a [`PolicyContext`].
//!
//! Invariants of a compiled [`ModelPolicy`]: every `max_tries` is at least 1 (a document's `0`,
//! negative or omitted value is replaced by `--max-tries-per-step`, itself at least 1), every
//! gate threshold is finite, `fallback_provider` names a provider whose key is configured and a
//! non-empty model. Validation reports every problem found, each naming the field path.

use std::fmt;

use super::document::{
    FallbackStepDocument, GatesDocument, MatchDocument, ParseError, PolicyDocument,
    PrimaryStepDocument, ProviderDocument, ThresholdDocument,
};
use super::gates::{Gate, Gates, Metric, Op, Unit};
use super::matching::Match;
pub use crate::logic::routing::Strategy;

/// Admission profile (seed "B4: serverless key limits").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// B1, B2 and B3 only.
    #[default]
    Reserved,
    /// B1–B3 plus the per-key B4 limits.
    Serverless,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Reserved => "reserved",
            Mode::Serverless => "serverless",
        }
    }
}

/// An external provider a policy's `fallback_provider.engine` names. Lowercase and
/// case-sensitive on the wire (`openai`, `anthropic`). What reaching one takes (its key variable,
/// its endpoint) is the provider client's: `router::provider::settings` adds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderEngine {
    OpenAi,
    Anthropic,
}

impl ProviderEngine {
    /// The policy spelling; anything else (including `OpenAI`) is not a supported provider.
    pub fn parse(name: &str) -> Option<ProviderEngine> {
        match name {
            "openai" => Some(ProviderEngine::OpenAi),
            "anthropic" => Some(ProviderEngine::Anthropic),
            _ => None,
        }
    }

    /// The policy spelling, also the `provider` label of the outbound HTTP metric.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderEngine::OpenAi => "openai",
            ProviderEngine::Anthropic => "anthropic",
        }
    }
}

impl fmt::Display for ProviderEngine {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// `fallback_provider`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFallback {
    pub engine: ProviderEngine,
    /// Sent to the provider in place of the requested model; non-empty.
    pub model: Box<str>,
}

/// One local routing step (`routing_policy` or a `fallback_chain` entry), compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// `routing_policy`, the entry's `name`, or `fallback_chain[i]` when it has none.
    pub name: Box<str>,
    /// The step's `match` (gate 4).
    pub filter: Match,
    /// The step's `exclude_if` (gate 7), per agent.
    pub exclude_if: Gates,
    pub strategy: Strategy,
    /// Failed forwards allowed in this step before advancing; at least 1.
    pub max_tries: u32,
}

/// The effective policy of one model: what the request path reads. Plain data; every limit is
/// `0` for "check disabled".
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPolicy {
    /// `global` for the global policy, otherwise the named document's name (file stem or admin
    /// API name); for logs.
    pub name: Box<str>,
    pub mode: Mode,
    /// B1: largest learned prompt estimate per request, tokens; `0`: no cap.
    pub max_input_tokens: u64,
    /// B1: most images per request; `0`: no cap.
    pub images_max: u32,
    /// B2: token-weighted occupancy capacity per healthy replica, tokens; `0`: no budget.
    pub admit_budget_tokens: u64,
    /// B2: in-flight request backstop per healthy replica; `0`: no count limit.
    pub max_inflight: u32,
    /// B3: thresholds on the healthy pool's averaged engine signals.
    pub shed_if: Gates,
    /// `routing_policy`, always tried first.
    pub primary: Step,
    /// Tried in order after the primary step is exhausted.
    pub fallback_chain: Box<[Step]>,
    /// Tried after every local step, for eligible chat requests.
    pub fallback_provider: Option<ProviderFallback>,
}

impl ModelPolicy {
    /// Whether a step ranks `prefix-aware`: the request path hashes the prompt's blocks only
    /// then.
    pub fn ranks_by_prefix(&self) -> bool {
        std::iter::once(&self.primary)
            .chain(&self.fallback_chain)
            .any(|step| step.strategy == Strategy::PrefixAware)
    }

    /// The built-in policy (no file, no `_default.yaml`): every agent, `least-loaded`,
    /// `--max-tries-per-step`, no admission limits, no fallback.
    pub fn built_in(context: &PolicyContext) -> ModelPolicy {
        ModelPolicy {
            name: GLOBAL_NAME.into(),
            mode: Mode::Reserved,
            max_input_tokens: 0,
            images_max: 0,
            admit_budget_tokens: 0,
            max_inflight: 0,
            shed_if: Gates::none(),
            primary: Step {
                name: PRIMARY_STEP.into(),
                filter: Match::any(),
                exclude_if: Gates::none(),
                strategy: Strategy::LeastLoaded,
                max_tries: context.max_tries_per_step.max(1),
            },
            fallback_chain: Box::new([]),
            fallback_provider: None,
        }
    }

    /// Every local step in order: the primary step, then the fallback chain.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        std::iter::once(&self.primary).chain(self.fallback_chain.iter())
    }
}

/// The name of the global policy in [`ModelPolicy::name`].
pub const GLOBAL_NAME: &str = "global";
/// The name of every primary step.
pub const PRIMARY_STEP: &str = "routing_policy";

/// Which provider credentials the router has (`HIVENET_ROUTER_OPENAI_API_KEY`,
/// `HIVENET_ROUTER_ANTHROPIC_API_KEY` non-empty). Read once at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProviderKeys {
    pub openai: bool,
    pub anthropic: bool,
}

impl ProviderKeys {
    pub fn has(self, engine: ProviderEngine) -> bool {
        match engine {
            ProviderEngine::OpenAi => self.openai,
            ProviderEngine::Anthropic => self.anthropic,
        }
    }
}

/// Router settings compilation depends on; fixed for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyContext {
    /// `--max-tries-per-step`: the budget of steps whose `max_tries` is 0, negative or omitted.
    /// At least 1 (start-up refuses less).
    pub max_tries_per_step: u32,
    pub provider_keys: ProviderKeys,
}

impl Default for PolicyContext {
    fn default() -> Self {
        PolicyContext {
            max_tries_per_step: 3,
            provider_keys: ProviderKeys::default(),
        }
    }
}

/// Whether a document is the global policy (`--policy-file`, `_default.yaml`,
/// `PUT /admin/policy`: `models` ignored) or a named one (`models` required).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role<'a> {
    Global,
    Named(&'a str),
}

/// One validation problem: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// E.g. `routing_policy.exclude_if.sucess_rate`, `fallback_chain[1].strategy`, `mode`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Why a policy document was refused. `origin` says where it came from (`--policy-file
/// /etc/...`, `policy file /dir/llama.yaml`, `PUT /admin/policy`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("{origin}: policy YAML could not be parsed: {error}")]
    Parse { origin: String, error: ParseError },
    #[error("{origin}: invalid policy: {problems}")]
    Invalid { origin: String, problems: Problems },
}

impl PolicyError {
    /// The problems of an `Invalid` error (empty for a parse error).
    pub fn problems(&self) -> &[Problem] {
        match self {
            PolicyError::Parse { .. } => &[],
            PolicyError::Invalid { problems, .. } => &problems.0,
        }
    }
}

/// A validated document: the compiled policy, the document as it will be shown by
/// `GET /admin/policy*` (a global policy's `models` removed, a named one's deduplicated), and
/// warnings about values that are valid but probably not meant (for the log).
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub document: PolicyDocument,
    pub policy: ModelPolicy,
    pub warnings: Vec<String>,
}

/// Parses and validates policy text.
pub fn compile_text(
    origin: &str,
    text: &str,
    role: Role<'_>,
    context: &PolicyContext,
) -> Result<Compiled, PolicyError> {
    let document = PolicyDocument::from_yaml(text).map_err(|error| PolicyError::Parse {
        origin: origin.to_owned(),
        error,
    })?;
    compile(origin, document, role, context)
}

/// Validates a parsed document. Reports every problem, not just the first.
pub fn compile(
    origin: &str,
    mut document: PolicyDocument,
    role: Role<'_>,
    context: &PolicyContext,
) -> Result<Compiled, PolicyError> {
    let mut check = Checker::default();
    let name = match role {
        Role::Global => {
            document.models.clear();
            GLOBAL_NAME
        }
        Role::Named(name) => {
            if document.models.is_empty() {
                check.problem("models", "a named policy must list at least one model");
            }
            for (index, model) in document.models.iter().enumerate() {
                if model.trim().is_empty() {
                    check.problem(format!("models[{index}]"), "must not be empty");
                }
            }
            let mut seen = std::collections::HashSet::new();
            document.models.retain(|model| seen.insert(model.clone()));
            name
        }
    };

    let mode = match document.mode.as_deref() {
        None | Some("") | Some("reserved") => Mode::Reserved,
        Some("serverless") => Mode::Serverless,
        Some(other) => {
            check.problem(
                "mode",
                format!("must be reserved or serverless, got {other:?}"),
            );
            Mode::Reserved
        }
    };
    let max_input_tokens = check.limit("max_input_tokens", document.max_input_tokens, u64::MAX);
    let images_max = check.limit("images_max", document.images_max, u64::from(u32::MAX)) as u32;
    let admit_budget_tokens = check.limit(
        "admit_budget_tokens",
        document.admit_budget_tokens,
        u64::MAX,
    );
    let max_inflight =
        check.limit("max_inflight", document.max_inflight, u64::from(u32::MAX)) as u32;
    let shed_if = match &document.shed_if {
        None => Gates::none(),
        Some(gates) => check.gates("shed_if", gates, Some(&Metric::SHED_IF)),
    };

    let primary = match &document.routing_policy {
        None => {
            check.problem(
                PRIMARY_STEP,
                "is required (at least `strategy: least-loaded`)",
            );
            None
        }
        Some(step) => check.primary(step, context),
    };
    let mut fallback_chain = Vec::with_capacity(document.fallback_chain.len());
    for (index, step) in document.fallback_chain.iter().enumerate() {
        if let Some(step) = check.fallback(index, step, context) {
            fallback_chain.push(step);
        }
    }
    let fallback_provider = document
        .fallback_provider
        .as_ref()
        .and_then(|provider| check.provider(provider, context.provider_keys));

    match primary {
        Some(primary) if check.problems.is_empty() => Ok(Compiled {
            policy: ModelPolicy {
                name: name.into(),
                mode,
                max_input_tokens,
                images_max,
                admit_budget_tokens,
                max_inflight,
                shed_if,
                primary,
                fallback_chain: fallback_chain.into_boxed_slice(),
                fallback_provider,
            },
            document,
            warnings: check.warnings,
        }),
        _ => Err(PolicyError::Invalid {
            origin: origin.to_owned(),
            problems: Problems(check.problems),
        }),
    }
}

/// Engine names agents register (`--engine`); a `match.engine` outside them can never match.
const BUILT_IN_ENGINES: [&str; 6] = ["vllm", "ollama", "sglang", "llamacpp", "infinity", "custom"];

/// The fields a primary and a fallback step share, borrowed from either document shape.
struct StepFields<'a> {
    /// Path for messages: `routing_policy` or `fallback_chain[i]`.
    field: &'a str,
    name: &'a str,
    filter: Option<&'a MatchDocument>,
    exclude_if: Option<&'a GatesDocument>,
    strategy: Option<&'a str>,
    max_tries: Option<i64>,
}

#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

impl Checker {
    fn problem(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    /// A non-negative integer limit no larger than `max`; `0` when omitted or refused.
    fn limit(&mut self, field: &str, value: Option<i64>, max: u64) -> u64 {
        match value {
            None => 0,
            Some(value) if value < 0 => {
                self.problem(
                    field,
                    format!("must not be negative (got {value}); use 0 to disable the check"),
                );
                0
            }
            Some(value) if value as u64 > max => {
                self.problem(field, format!("is too large (got {value}, at most {max})"));
                0
            }
            Some(value) => value as u64,
        }
    }

    /// `allowed`: the only metrics accepted here (`shed_if`), or every metric (`exclude_if`).
    fn gates(&mut self, field: &str, gates: &GatesDocument, allowed: Option<&[Metric]>) -> Gates {
        let mut rules = Vec::with_capacity(gates.0.len());
        for (name, threshold) in &gates.0 {
            let path = format!("{field}.{name}");
            let Some(metric) = Metric::parse(name) else {
                let expected = match allowed {
                    Some(allowed) => format!(
                        "{field} accepts only {}",
                        allowed
                            .iter()
                            .map(|metric| metric.name())
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                    None => format!(
                        "expected one of {}",
                        Metric::ALL
                            .iter()
                            .map(|metric| metric.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                let hint = suggestion(name, allowed.unwrap_or(&Metric::ALL))
                    .map(|metric| format!(" (did you mean {metric}?)"))
                    .unwrap_or_default();
                self.problem(path, format!("unknown metric{hint}; {expected}"));
                continue;
            };
            if let Some(allowed) = allowed
                && !allowed.contains(&metric)
            {
                self.problem(
                    path,
                    format!(
                        "is not accepted in {field}, which takes only kv_cache_utilization and \
                         waiting_requests (use exclude_if for per-agent gates)"
                    ),
                );
                continue;
            }
            if let Some(rule) = self.threshold(&path, metric, threshold) {
                rules.push(rule);
            }
        }
        Gates::from_rules(rules)
    }

    fn threshold(
        &mut self,
        path: &str,
        metric: Metric,
        threshold: &ThresholdDocument,
    ) -> Option<Gate> {
        let set: Vec<(Op, f64)> = [
            (Op::Gt, threshold.gt),
            (Op::Gte, threshold.gte),
            (Op::Lt, threshold.lt),
            (Op::Lte, threshold.lte),
        ]
        .into_iter()
        .filter_map(|(op, value)| value.map(|value| (op, value)))
        .collect();
        let (op, value) = match set.as_slice() {
            [one] => *one,
            [] => {
                self.problem(
                    path,
                    "needs exactly one operator (gt, gte, lt or lte), got none",
                );
                return None;
            }
            several => {
                let names: Vec<&str> = several.iter().map(|(op, _)| op.name()).collect();
                self.problem(
                    path,
                    format!(
                        "needs exactly one operator (gt, gte, lt or lte), got {}",
                        names.join(" and ")
                    ),
                );
                return None;
            }
        };
        if !value.is_finite() {
            self.problem(
                format!("{path}.{}", op.name()),
                format!("must be a finite number, got {value}"),
            );
            return None;
        }
        if metric.unit() == Unit::Fraction && !(0.0..=1.0).contains(&value) {
            self.warnings.push(format!(
                "{path}.{}: {value} is outside 0.0-1.0, but {metric} is a fraction (write 0.95 for 95%)",
                op.name()
            ));
        }
        Some(Gate {
            metric,
            op,
            threshold: value,
        })
    }

    fn filter(&mut self, field: &str, document: Option<&MatchDocument>) -> Match {
        let Some(document) = document else {
            return Match::any();
        };
        let condition = |value: &Option<String>| -> Option<Box<str>> {
            value
                .as_deref()
                .filter(|value| !value.is_empty())
                .map(Box::from)
        };
        if let Some(engine) = condition(&document.engine)
            && !BUILT_IN_ENGINES.contains(&&*engine)
        {
            self.warnings.push(format!(
                "{field}.engine: {engine:?} is not a built-in engine name ({}); only agents \
                 reporting exactly that engine match",
                BUILT_IN_ENGINES.join(", ")
            ));
        }
        let mut tags: Vec<Box<str>> = Vec::with_capacity(document.tags.len());
        for (index, tag) in document.tags.iter().enumerate() {
            if tag.is_empty() {
                self.warnings
                    .push(format!("{field}.tags[{index}]: empty tag ignored"));
            } else if !tags.iter().any(|seen| **seen == **tag) {
                tags.push(tag.as_str().into());
            }
        }
        Match {
            region: condition(&document.region),
            engine: condition(&document.engine),
            tags: tags.into_boxed_slice(),
            organization: condition(&document.organization),
            machine: condition(&document.machine),
            gpu_model: condition(&document.gpu_model),
        }
    }

    fn strategy(&mut self, field: &str, strategy: Option<&str>) -> Option<Strategy> {
        let field = format!("{field}.strategy");
        match strategy.map(str::trim) {
            None | Some("") => {
                self.problem(field, "is required (least-loaded)");
                None
            }
            Some(text) => {
                let strategy = Strategy::parse(text);
                if strategy.is_none() {
                    self.problem(
                        field,
                        format!(
                            "unknown strategy {text:?}; the strategies are {}",
                            Strategy::names()
                        ),
                    );
                }
                strategy
            }
        }
    }

    /// `0`, negative or omitted: the router-wide default.
    fn max_tries(&mut self, field: &str, value: Option<i64>, context: &PolicyContext) -> u32 {
        match value {
            Some(value) if value > i64::from(u32::MAX) => {
                self.problem(
                    format!("{field}.max_tries"),
                    format!("is too large (got {value}, at most {})", u32::MAX),
                );
                0
            }
            Some(value) if value > 0 => value as u32,
            _ => context.max_tries_per_step.max(1),
        }
    }

    fn step(&mut self, step: StepFields<'_>, context: &PolicyContext) -> Option<Step> {
        let field = step.field;
        let filter = self.filter(&format!("{field}.match"), step.filter);
        let exclude_if = match step.exclude_if {
            None => Gates::none(),
            Some(gates) => self.gates(&format!("{field}.exclude_if"), gates, None),
        };
        let strategy = self.strategy(field, step.strategy);
        let max_tries = self.max_tries(field, step.max_tries, context);
        Some(Step {
            name: step.name.into(),
            filter,
            exclude_if,
            strategy: strategy?,
            max_tries,
        })
    }

    fn primary(&mut self, step: &PrimaryStepDocument, context: &PolicyContext) -> Option<Step> {
        self.step(
            StepFields {
                field: PRIMARY_STEP,
                name: PRIMARY_STEP,
                filter: step.filter.as_ref(),
                exclude_if: step.exclude_if.as_ref(),
                strategy: step.strategy.as_deref(),
                max_tries: step.max_tries,
            },
            context,
        )
    }

    fn fallback(
        &mut self,
        index: usize,
        step: &FallbackStepDocument,
        context: &PolicyContext,
    ) -> Option<Step> {
        let field = format!("fallback_chain[{index}]");
        let name = match step.name.as_deref().map(str::trim) {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => field.clone(),
        };
        self.step(
            StepFields {
                field: &field,
                name: &name,
                filter: step.filter.as_ref(),
                exclude_if: step.exclude_if.as_ref(),
                strategy: step.strategy.as_deref(),
                max_tries: step.max_tries,
            },
            context,
        )
    }

    fn provider(
        &mut self,
        provider: &ProviderDocument,
        keys: ProviderKeys,
    ) -> Option<ProviderFallback> {
        let engine = match provider.engine.as_deref() {
            None | Some("") => {
                self.problem(
                    "fallback_provider.engine",
                    "is required (openai or anthropic)",
                );
                None
            }
            Some(text) => match ProviderEngine::parse(text) {
                None => {
                    self.problem(
                        "fallback_provider.engine",
                        format!("unsupported provider {text:?}; expected openai or anthropic"),
                    );
                    None
                }
                Some(engine) if !keys.has(engine) => {
                    self.problem(
                        "fallback_provider.engine",
                        format!(
                            "{} needs {}, which is not set (provider keys are read at start-up)",
                            engine.as_str(),
                            engine.key_variable()
                        ),
                    );
                    None
                }
                Some(engine) => Some(engine),
            },
        };
        let model = match provider.model.as_deref().map(str::trim) {
            None | Some("") => {
                self.problem(
                    "fallback_provider.model",
                    "is required and must not be empty",
                );
                None
            }
            Some(model) => Some(Box::<str>::from(model)),
        };
        Some(ProviderFallback {
            engine: engine?,
            model: model?,
        })
    }
}

/// The known name closest to a misspelt metric, when it is within two edits.
fn suggestion(name: &str, known: &[Metric]) -> Option<Metric> {
    known
        .iter()
        .map(|metric| (edit_distance(name, metric.name()), *metric))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, metric)| metric)
}

/// Levenshtein distance over bytes; inputs are short field names.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, &left) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, &right) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(left != right);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests;

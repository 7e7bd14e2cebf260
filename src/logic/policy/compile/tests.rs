//! Compilation: the reference's examples compile to the expected plain values; every bad input
//! is refused with a message naming the origin and the field.

use super::*;
use crate::logic::policy::gates::Signals;

const ORIGIN: &str = "policy file /etc/policies/test.yaml";

fn context() -> PolicyContext {
    PolicyContext {
        max_tries_per_step: 3,
        provider_keys: ProviderKeys {
            openai: true,
            anthropic: false,
        },
    }
}

fn global(text: &str) -> Result<Compiled, PolicyError> {
    compile_text(ORIGIN, text, Role::Global, &context())
}

fn named(text: &str) -> Result<Compiled, PolicyError> {
    compile_text(ORIGIN, text, Role::Named("llama"), &context())
}

/// The error text for `text` as a global policy, which must be refused.
fn refused(text: &str) -> String {
    match global(text) {
        Ok(compiled) => panic!("accepted: {:?}", compiled.policy),
        Err(error) => {
            let message = error.to_string();
            assert!(message.starts_with(ORIGIN), "{message}");
            message
        }
    }
}

const MINIMAL: &str = "routing_policy:\n  strategy: least-loaded\n";

#[test]
fn the_complete_reference_example_compiles() {
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
  - match: {}
    strategy: least-loaded
fallback_provider:
  engine: openai
  model: gpt-4o-mini
"#;
    let compiled = named(text).unwrap();
    assert!(compiled.warnings.is_empty(), "{:?}", compiled.warnings);
    let policy = compiled.policy;
    assert_eq!(&*policy.name, "llama");
    assert_eq!(policy.mode, Mode::Reserved);
    assert_eq!(policy.max_input_tokens, 131_072);
    assert_eq!(policy.images_max, 8);
    assert_eq!(policy.admit_budget_tokens, 262_144);
    assert_eq!(policy.max_inflight, 16);
    assert_eq!(policy.shed_if.rules().len(), 2);
    assert!(policy.shed_if.fails(&Signals {
        waiting_requests: Some(21.0),
        ..Signals::default()
    }));
    assert!(!policy.shed_if.fails(&Signals {
        waiting_requests: Some(20.0),
        ..Signals::default()
    }));

    let primary = &policy.primary;
    assert_eq!(&*primary.name, "routing_policy");
    assert_eq!(primary.filter.region.as_deref(), Some("EU-France"));
    assert_eq!(primary.filter.engine.as_deref(), Some("vllm"));
    assert_eq!(&*primary.filter.tags, [Box::from("production")]);
    assert_eq!(primary.exclude_if.rules().len(), 2);
    assert_eq!(primary.strategy, Strategy::LeastLoaded);
    assert_eq!(primary.max_tries, 3);

    assert_eq!(policy.fallback_chain.len(), 2);
    assert_eq!(&*policy.fallback_chain[0].name, "any-vllm-region");
    assert_eq!(policy.fallback_chain[0].max_tries, 2);
    // Unnamed steps are named by position; omitted max_tries is the router-wide value.
    assert_eq!(&*policy.fallback_chain[1].name, "fallback_chain[1]");
    assert_eq!(policy.fallback_chain[1].max_tries, 3);
    assert!(policy.fallback_chain[1].filter.is_empty());
    assert_eq!(policy.steps().count(), 3);

    assert_eq!(
        policy.fallback_provider,
        Some(ProviderFallback {
            engine: ProviderEngine::OpenAi,
            model: "gpt-4o-mini".into()
        })
    );
}

#[test]
fn defaults_and_the_built_in_policy() {
    let compiled = global(MINIMAL).unwrap();
    let policy = &compiled.policy;
    assert_eq!(&*policy.name, "global");
    assert_eq!(policy.mode, Mode::Reserved);
    assert_eq!(
        (
            policy.max_input_tokens,
            policy.images_max,
            policy.admit_budget_tokens,
            policy.max_inflight
        ),
        (0, 0, 0, 0)
    );
    assert!(policy.shed_if.is_empty());
    assert!(policy.fallback_chain.is_empty());
    assert_eq!(policy.fallback_provider, None);
    // The built-in document compiles to the built-in policy.
    assert_eq!(
        compile(ORIGIN, PolicyDocument::built_in(), Role::Global, &context())
            .unwrap()
            .policy,
        ModelPolicy::built_in(&context())
    );
    // An empty mode is reserved; serverless is accepted.
    assert_eq!(
        global(&format!("mode: \"\"\n{MINIMAL}"))
            .unwrap()
            .policy
            .mode,
        Mode::Reserved
    );
    assert_eq!(
        global(&format!("mode: serverless\n{MINIMAL}"))
            .unwrap()
            .policy
            .mode,
        Mode::Serverless
    );
}

#[test]
fn zero_and_negative_max_tries_use_the_router_wide_value() {
    for value in ["0", "-2"] {
        let policy = global(&format!("{MINIMAL}  max_tries: {value}\n"))
            .unwrap()
            .policy;
        assert_eq!(policy.primary.max_tries, 3, "max_tries: {value}");
    }
    let message = refused(&format!("{MINIMAL}  max_tries: 99999999999\n"));
    assert!(message.contains("routing_policy.max_tries"), "{message}");
}

#[test]
fn models_are_ignored_for_the_global_policy_and_required_for_named_ones() {
    let compiled = global(&format!("models: [a, b]\n{MINIMAL}")).unwrap();
    assert!(compiled.document.models.is_empty());

    let error = named(MINIMAL).unwrap_err().to_string();
    assert!(
        error.contains("models: a named policy must list at least one model"),
        "{error}"
    );
    let error = named(&format!("models: [\"\"]\n{MINIMAL}"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("models[0]: must not be empty"), "{error}");
    let compiled = named(&format!("models: [a, b, a]\n{MINIMAL}")).unwrap();
    assert_eq!(compiled.document.models, ["a", "b"]);
}

#[test]
fn negative_and_oversized_limits_are_refused() {
    for field in [
        "max_input_tokens",
        "images_max",
        "admit_budget_tokens",
        "max_inflight",
    ] {
        let message = refused(&format!("{field}: -1\n{MINIMAL}"));
        assert!(
            message.contains(&format!("{field}: must not be negative (got -1)")),
            "{message}"
        );
    }
    let message = refused(&format!("max_inflight: 4294967296\n{MINIMAL}"));
    assert!(message.contains("max_inflight: is too large"), "{message}");
    // Every problem is reported, not just the first.
    let message = refused(&format!("images_max: -1\nmax_inflight: -2\n{MINIMAL}"));
    assert!(
        message.contains("images_max") && message.contains("max_inflight"),
        "{message}"
    );
}

#[test]
fn bad_modes_are_refused() {
    for mode in ["fast", "Serverless", "RESERVED"] {
        let message = refused(&format!("mode: {mode}\n{MINIMAL}"));
        assert!(
            message.contains(&format!(
                "mode: must be reserved or serverless, got \"{mode}\""
            )),
            "{message}"
        );
    }
}

#[test]
fn unknown_fields_are_refused_naming_the_field() {
    let message = refused("routing_policy:\n  strategy: least-loaded\n  retries: 2\n");
    assert!(message.contains("could not be parsed"), "{message}");
    assert!(
        message.contains("routing_policy: unknown field `retries`"),
        "{message}"
    );
    let message = refused("max_inflights: 2\nrouting_policy: {strategy: least-loaded}\n");
    assert!(
        message.contains("unknown field `max_inflights`"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}  match:\n    zone: eu\n"));
    assert!(
        message.contains("routing_policy.match: unknown field `zone`"),
        "{message}"
    );
    let message = refused(&format!(
        "fallback_provider:\n  engine: openai\n  model: m\n  api_key: x\n{MINIMAL}"
    ));
    assert!(
        message.contains("fallback_provider: unknown field `api_key`"),
        "{message}"
    );
}

#[test]
fn unknown_metrics_are_refused_with_a_suggestion() {
    let message = refused(&format!(
        "{MINIMAL}  exclude_if:\n    sucess_rate:\n      lt: 0.95\n"
    ));
    assert!(
        message.contains(
            "routing_policy.exclude_if.sucess_rate: unknown metric (did you mean success_rate?)"
        ),
        "{message}"
    );
    assert!(
        message.contains("expected one of capacity_utilization"),
        "{message}"
    );
    let message = refused(&format!(
        "{MINIMAL}fallback_chain:\n  - strategy: least-loaded\n    exclude_if:\n      preemptions: {{gt: 1}}\n"
    ));
    assert!(
        message.contains("fallback_chain[0].exclude_if.preemptions: unknown metric"),
        "{message}"
    );
}

#[test]
fn shed_if_takes_only_pool_signals() {
    let message = refused(&format!("shed_if:\n  success_rate: {{lt: 0.9}}\n{MINIMAL}"));
    assert!(
        message.contains("shed_if.success_rate: is not accepted in shed_if"),
        "{message}"
    );
    let message = refused(&format!("shed_if:\n  kv_cache: {{gt: 0.9}}\n{MINIMAL}"));
    assert!(
        message.contains(
            "shed_if.kv_cache: unknown metric; shed_if accepts only kv_cache_utilization and waiting_requests"
        ),
        "{message}"
    );
}

#[test]
fn each_metric_needs_exactly_one_known_operator() {
    let message = refused(&format!("{MINIMAL}  exclude_if:\n    success_rate: {{}}\n"));
    assert!(
        message.contains("routing_policy.exclude_if.success_rate: needs exactly one operator (gt, gte, lt or lte), got none"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}  exclude_if:\n    success_rate:\n"));
    assert!(message.contains("got none"), "{message}");
    let message = refused(&format!(
        "{MINIMAL}  exclude_if:\n    success_rate:\n      lt: 0.95\n      gt: 0.5\n"
    ));
    assert!(message.contains("got gt and lt"), "{message}");
    let message = refused(&format!("{MINIMAL}  exclude_if:\n    srtt: {{eq: 5}}\n"));
    assert!(
        message.contains("routing_policy.exclude_if.srtt: unknown field `eq`"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}  exclude_if:\n    srtt: {{gt: .nan}}\n"));
    assert!(
        message.contains("srtt.gt: must be a finite number"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}  exclude_if:\n    srtt: {{gt: fast}}\n"));
    assert!(message.contains("could not be parsed"), "{message}");
}

#[test]
fn every_gate_unit_and_operator_compiles() {
    let mut text = String::from(MINIMAL);
    text.push_str("  exclude_if:\n");
    for (index, metric) in Metric::ALL.iter().enumerate() {
        let op = Op::ALL[index % 4].name();
        text.push_str(&format!("    {}: {{{op}: 0.5}}\n", metric.name()));
    }
    let policy = global(&text).unwrap().policy;
    assert_eq!(policy.primary.exclude_if.rules().len(), Metric::ALL.len());
    // Percentages written as 0-100 compile with a warning.
    let compiled = global(&format!(
        "{MINIMAL}  exclude_if:\n    gpu_util_percent: {{gt: 95}}\n"
    ))
    .unwrap();
    assert_eq!(compiled.warnings.len(), 1, "{:?}", compiled.warnings);
    assert!(
        compiled.warnings[0].contains("0.95"),
        "{:?}",
        compiled.warnings
    );
}

#[test]
fn every_strategy_parses_and_compiles() {
    for strategy in Strategy::ALL {
        assert_eq!(Strategy::parse(strategy.name()), Some(strategy));
        let text = format!(
            "routing_policy:\n  strategy: {}\nfallback_chain:\n  - strategy: {}\n",
            strategy.name(),
            strategy.name()
        );
        let compiled = global(&text).expect("compiles").policy;
        assert_eq!(compiled.primary.strategy, strategy, "{}", strategy.name());
        assert_eq!(compiled.fallback_chain[0].strategy, strategy);
    }
    let message = refused("routing_policy:\n  strategy: fastest\n");
    assert!(
        message.contains(
            "unknown strategy \"fastest\"; the strategies are least-loaded, lowest-srtt, \
             round-robin, prefix-aware, lowest-kv-cache, lowest-queue, best-ttft, best-itl"
        ),
        "{message}"
    );
    let message = refused("routing_policy:\n  match: {}\n");
    assert!(
        message.contains("routing_policy.strategy: is required"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}fallback_chain:\n  - name: x\n"));
    assert!(
        message.contains("fallback_chain[0].strategy: is required"),
        "{message}"
    );
    let message = refused("max_inflight: 1\n");
    assert!(message.contains("routing_policy: is required"), "{message}");
    let message = refused("");
    assert!(message.contains("routing_policy: is required"), "{message}");
}

#[test]
fn provider_fallback_needs_a_known_engine_a_model_and_its_key() {
    let message = refused(&format!("fallback_provider:\n  model: m\n{MINIMAL}"));
    assert!(
        message.contains("fallback_provider.engine: is required"),
        "{message}"
    );
    let message = refused(&format!("fallback_provider:\n  engine: openai\n{MINIMAL}"));
    assert!(
        message.contains("fallback_provider.model: is required"),
        "{message}"
    );
    let message = refused(&format!(
        "fallback_provider:\n  engine: mistral\n  model: m\n{MINIMAL}"
    ));
    assert!(
        message.contains("unsupported provider \"mistral\""),
        "{message}"
    );
    let message = refused(&format!(
        "fallback_provider:\n  engine: OpenAI\n  model: m\n{MINIMAL}"
    ));
    assert!(
        message.contains("unsupported provider \"OpenAI\""),
        "{message}"
    );
    // Supported, but no HIVENET_ROUTER_ANTHROPIC_API_KEY in this context.
    let message = refused(&format!(
        "fallback_provider:\n  engine: anthropic\n  model: claude\n{MINIMAL}"
    ));
    assert!(
        message.contains("anthropic needs HIVENET_ROUTER_ANTHROPIC_API_KEY, which is not set"),
        "{message}"
    );
}

#[test]
fn malformed_yaml_is_refused_with_a_location() {
    let error =
        global("routing_policy:\n  strategy: least-loaded\n    max_tries: 2\n").unwrap_err();
    let PolicyError::Parse { error: parse, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(parse.line.is_some(), "{error}");
    assert!(error.to_string().starts_with(ORIGIN), "{error}");
    assert!(global("routing_policy: {strategy: [").is_err());
    assert!(global("\t- nonsense").is_err());
}

#[test]
fn match_conditions_compile_and_warn_about_unknown_engines() {
    let compiled = global(
        "routing_policy:\n  match:\n    engine: llama.cpp\n    region: \"\"\n    tags: [a, \"\", a, b]\n  strategy: least-loaded\n",
    )
    .unwrap();
    let filter = &compiled.policy.primary.filter;
    assert_eq!(filter.engine.as_deref(), Some("llama.cpp"));
    assert_eq!(filter.region, None);
    assert_eq!(&*filter.tags, [Box::from("a"), Box::from("b")]);
    assert_eq!(compiled.warnings.len(), 2, "{:?}", compiled.warnings);
    assert!(
        compiled.warnings[0].contains("llama.cpp"),
        "{:?}",
        compiled.warnings
    );
}

#[test]
fn suggestions_stay_close() {
    assert_eq!(edit_distance("sucess_rate", "success_rate"), 1);
    assert_eq!(edit_distance("", "srtt"), 4);
    assert_eq!(suggestion("srt", &Metric::ALL), Some(Metric::Srtt));
    assert_eq!(suggestion("temperature", &Metric::ALL), None);
}

#[test]
fn deeply_nested_policies_are_refused_before_parsing() {
    let text = format!(
        "{MINIMAL}shed_if: {}{}\n",
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    let started = std::time::Instant::now();
    let message = refused(&text);
    assert!(
        message.contains("nesting deeper than 64 levels (line 3)"),
        "{message}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

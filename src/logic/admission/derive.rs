//! `hivenet-router derive-key-defaults`: suggested B4 values for the keys of one serverless model,
//! from the model's certified limits (seed `admission-control.md`, "Validation and derived
//! defaults"). The router never applies these by itself; operators or provisioning tooling copy
//! the printed values into `auth.yaml` or a dynamic-key write.
//!
//! Certified limits (`router_limits.yaml`, one model per file; every field required):
//!
//! ```yaml
//! model: Qwen/Qwen3.6-27B
//! max_input_tokens: 131072          # the policy's B1 cap for the model
//! admit_budget_tokens: 262144       # the policy's per-replica occupancy budget
//! prefill_tokens_per_second: 20000  # sustained prompt throughput of one replica
//! decode_tokens_per_second: 2500    # sustained aggregate output throughput of one replica
//! ```
//!
//! Derivation, for `keys` keys sharing `replicas` replicas with an `oversubscription` factor
//! (how many times the pool the key shares may add up to; the seed allows oversubscription):
//! - `max_occupancy_share = min(1, oversubscription / keys)`, rounded down to three decimals and
//!   never below 0.001;
//! - `input_tokens_per_minute = max(max_input_tokens, ⌊prefill × 60 × replicas × share⌋)`, so the
//!   cross-config invariant (a nonzero ITPM is at least `max_input_tokens`) always holds;
//! - `output_tokens_per_minute = ⌊decode × 60 × replicas × share⌋`, at least 1.

use std::path::PathBuf;

use serde::Deserialize;

/// One model's certified limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertifiedLimits {
    pub model: String,
    pub max_input_tokens: u64,
    pub admit_budget_tokens: u64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
}

/// How the model is shared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sharing {
    pub keys: u32,
    pub replicas: u32,
    pub oversubscription: f64,
}

/// The suggested key values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyDefaults {
    pub max_occupancy_share: f64,
    pub input_tokens_per_minute: u64,
    pub output_tokens_per_minute: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DeriveError {
    #[error("{0} must be greater than 0")]
    NotPositive(&'static str),
    #[error("oversubscription must be a finite number in (0, 100], got {0}")]
    Oversubscription(f64),
}

fn positive(field: &'static str, value: f64) -> Result<(), DeriveError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(DeriveError::NotPositive(field))
    }
}

pub fn derive(limits: &CertifiedLimits, sharing: Sharing) -> Result<KeyDefaults, DeriveError> {
    positive("max_input_tokens", limits.max_input_tokens as f64)?;
    positive("admit_budget_tokens", limits.admit_budget_tokens as f64)?;
    positive(
        "prefill_tokens_per_second",
        limits.prefill_tokens_per_second,
    )?;
    positive("decode_tokens_per_second", limits.decode_tokens_per_second)?;
    positive("--keys", f64::from(sharing.keys))?;
    positive("--replicas", f64::from(sharing.replicas))?;
    if !(sharing.oversubscription.is_finite()
        && sharing.oversubscription > 0.0
        && sharing.oversubscription <= 100.0)
    {
        return Err(DeriveError::Oversubscription(sharing.oversubscription));
    }
    let share = (sharing.oversubscription / f64::from(sharing.keys)).min(1.0);
    let share = ((share * 1000.0).floor() / 1000.0).max(0.001);
    let per_minute =
        |tokens_per_second: f64| tokens_per_second * 60.0 * f64::from(sharing.replicas) * share;
    Ok(KeyDefaults {
        max_occupancy_share: share,
        input_tokens_per_minute: (per_minute(limits.prefill_tokens_per_second).floor() as u64)
            .max(limits.max_input_tokens),
        output_tokens_per_minute: (per_minute(limits.decode_tokens_per_second).floor() as u64)
            .max(1),
    })
}

/// The key-entry fragment to paste into `auth.yaml` (under a key, beside `key_hash`).
pub fn render(limits: &CertifiedLimits, sharing: Sharing, defaults: &KeyDefaults) -> String {
    format!(
        "# {model}: {keys} keys sharing {replicas} replica(s), oversubscription {over}\n\
         max_occupancy_share: {share}\n\
         quota:\n  input_tokens_per_minute: {itpm}\n  output_tokens_per_minute: {otpm}\n",
        model = limits.model,
        keys = sharing.keys,
        replicas = sharing.replicas,
        over = sharing.oversubscription,
        share = defaults.max_occupancy_share,
        itpm = defaults.input_tokens_per_minute,
        otpm = defaults.output_tokens_per_minute,
    )
}

/// `hivenet-router derive-key-defaults`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "hivenet-router derive-key-defaults",
    about = "Suggest B4 key values (max_occupancy_share, input/output tokens per minute) for a serverless model"
)]
pub struct DeriveArgs {
    /// The model's certified limits (`router_limits.yaml`).
    #[arg(long)]
    pub limits: PathBuf,
    /// Keys that will share the model.
    #[arg(long)]
    pub keys: u32,
    /// Healthy replicas serving the model.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// How many times the pool the keys' shares may add up to.
    #[arg(long, default_value_t = 1.0)]
    pub oversubscription: f64,
}

/// Runs the subcommand: the fragment on stdout, or an error naming what is wrong.
pub fn run(args: &DeriveArgs) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = std::fs::read_to_string(&args.limits)
        .with_context(|| format!("cannot read {}", args.limits.display()))?;
    let limits: CertifiedLimits = crate::base::doc_guard::from_yaml(&text)
        .with_context(|| format!("{} is not valid certified limits", args.limits.display()))?;
    let sharing = Sharing {
        keys: args.keys,
        replicas: args.replicas,
        oversubscription: args.oversubscription,
    };
    let defaults = derive(&limits, sharing)?;
    Ok(render(&limits, sharing, &defaults))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> CertifiedLimits {
        CertifiedLimits {
            model: "m".into(),
            max_input_tokens: 131072,
            admit_budget_tokens: 262144,
            prefill_tokens_per_second: 20000.0,
            decode_tokens_per_second: 2500.0,
        }
    }

    fn sharing(keys: u32, replicas: u32, oversubscription: f64) -> Sharing {
        Sharing {
            keys,
            replicas,
            oversubscription,
        }
    }

    #[test]
    fn shares_the_pool_between_keys() {
        let defaults = derive(&limits(), sharing(8, 2, 2.0)).unwrap();
        assert_eq!(defaults.max_occupancy_share, 0.25);
        // 20000 × 60 × 2 × 0.25 = 600000.
        assert_eq!(defaults.input_tokens_per_minute, 600_000);
        // 2500 × 60 × 2 × 0.25 = 75000.
        assert_eq!(defaults.output_tokens_per_minute, 75_000);
    }

    #[test]
    fn input_rate_never_below_the_input_cap() {
        let defaults = derive(&limits(), sharing(100, 1, 1.0)).unwrap();
        assert_eq!(defaults.max_occupancy_share, 0.01);
        assert_eq!(defaults.input_tokens_per_minute, 131072);
        assert_eq!(defaults.output_tokens_per_minute, 1500);
    }

    #[test]
    fn share_is_capped_at_one_and_floored_above_zero() {
        assert_eq!(
            derive(&limits(), sharing(1, 1, 4.0))
                .unwrap()
                .max_occupancy_share,
            1.0
        );
        assert_eq!(
            derive(&limits(), sharing(1_000_000, 1, 1.0))
                .unwrap()
                .max_occupancy_share,
            0.001
        );
    }

    #[test]
    fn refuses_nonsense() {
        assert_eq!(
            derive(&limits(), sharing(0, 1, 1.0)),
            Err(DeriveError::NotPositive("--keys"))
        );
        assert!(matches!(
            derive(&limits(), sharing(1, 1, f64::NAN)),
            Err(DeriveError::Oversubscription(_))
        ));
        let zero = CertifiedLimits {
            decode_tokens_per_second: 0.0,
            ..limits()
        };
        assert_eq!(
            derive(&zero, sharing(1, 1, 1.0)),
            Err(DeriveError::NotPositive("decode_tokens_per_second"))
        );
    }

    #[test]
    fn rendered_fragment_is_yaml_with_the_values() {
        let sharing = sharing(8, 2, 2.0);
        let defaults = derive(&limits(), sharing).unwrap();
        let text = render(&limits(), sharing, &defaults);
        let value: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(value["max_occupancy_share"].as_f64(), Some(0.25));
        assert_eq!(
            value["quota"]["input_tokens_per_minute"].as_u64(),
            Some(600_000)
        );
    }
}

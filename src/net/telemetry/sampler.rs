//! Which traces this process records: `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, the
//! OpenTelemetry SDK's variables, with the SDK's names and meanings.
//!
//! | `OTEL_TRACES_SAMPLER` | a request without a `traceparent` | a request with one |
//! | --- | --- | --- |
//! | `parentbased_always_on` (default) | recorded | as its parent's `sampled` flag says |
//! | `parentbased_always_off` | not recorded | as its parent says |
//! | `parentbased_traceidratio` | recorded with probability `ARG` | as its parent says |
//! | `always_on` | recorded | recorded |
//! | `always_off` | not recorded | not recorded |
//! | `traceidratio` | recorded with probability `ARG` | the same, from the trace id |
//!
//! The ratio is decided from the trace id (its last 8 bytes, as the SDK does), so every process
//! of a trace that uses the same ratio makes the same decision. The decision is the `sampled`
//! flag of the span's context: it goes on in `traceparent` to the agent and the engine, and a
//! span whose flag is clear is not exported (its trace id is still returned and audited).
//! Pure: no clock, no I/O.

/// How a span's `sampled` flag is decided (module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Follow the parent's flag when there is a parent.
    parent_based: bool,
    /// The probability of recording a trace the parent does not decide, `0.0..=1.0`.
    ratio: f64,
}

impl Default for Sampler {
    /// `parentbased_always_on`, the SDK's default.
    fn default() -> Sampler {
        Sampler {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

/// The names `OTEL_TRACES_SAMPLER` takes.
pub const SAMPLER_NAMES: [&str; 6] = [
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
    "always_on",
    "always_off",
    "traceidratio",
];

impl Sampler {
    /// The sampler `name` names, with `arg` the ratio of the two `traceidratio` samplers (1.0
    /// when absent, as the SDK defaults it; ignored by the others).
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
        let ratio = || -> Result<f64, String> {
            let Some(arg) = arg.map(str::trim).filter(|arg| !arg.is_empty()) else {
                return Ok(1.0);
            };
            match arg.parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
                _ => Err(format!(
                    "OTEL_TRACES_SAMPLER_ARG {arg:?} is not a probability between 0 and 1"
                )),
            }
        };
        let (parent_based, ratio) = match name.trim() {
            "" | "parentbased_always_on" => (true, 1.0),
            "parentbased_always_off" => (true, 0.0),
            "parentbased_traceidratio" => (true, ratio()?),
            "always_on" => (false, 1.0),
            "always_off" => (false, 0.0),
            "traceidratio" => (false, ratio()?),
            other => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER {other:?} is not one of {}",
                    SAMPLER_NAMES.join(", ")
                ));
            }
        };
        Ok(Sampler {
            parent_based,
            ratio,
        })
    }

    /// Whether a span of `trace_id` is recorded; `parent_sampled` is the parent's flag when
    /// the span continues a remote parent.
    pub fn samples(&self, parent_sampled: Option<bool>, trace_id: &[u8; 16]) -> bool {
        if self.parent_based
            && let Some(parent) = parent_sampled
        {
            return parent;
        }
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 {
            return false;
        }
        // The SDK's rule: the trace id's last 8 bytes, halved, under the ratio of 2^63.
        let bound = (self.ratio * (1u64 << 63) as f64) as u64;
        let draw = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes")) >> 1;
        draw < bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(last: u64) -> [u8; 16] {
        let mut id = [7u8; 16];
        id[8..].copy_from_slice(&last.to_be_bytes());
        id
    }

    #[test]
    fn names_and_ratios_read_as_the_sdk_reads_them() {
        assert_eq!(Sampler::parse("", None), Ok(Sampler::default()));
        assert_eq!(
            Sampler::parse("parentbased_traceidratio", Some("0.25")),
            Ok(Sampler {
                parent_based: true,
                ratio: 0.25
            })
        );
        assert_eq!(
            Sampler::parse("traceidratio", None),
            Ok(Sampler {
                parent_based: false,
                ratio: 1.0
            })
        );
        // The ratio of a sampler that takes none is not read.
        assert!(Sampler::parse("always_off", Some("nonsense")).is_ok());
        assert!(Sampler::parse("traceidratio", Some("1.5")).is_err());
        assert!(Sampler::parse("traceidratio", Some("x")).is_err());
        let unknown = Sampler::parse("jaeger_remote", None).unwrap_err();
        assert!(unknown.contains("parentbased_traceidratio"), "{unknown}");
    }

    #[test]
    fn parent_based_follows_the_parent_and_the_others_do_not() {
        let off = Sampler::parse("parentbased_always_off", None).unwrap();
        assert!(off.samples(Some(true), &trace(0)));
        assert!(!off.samples(Some(false), &trace(0)));
        assert!(!off.samples(None, &trace(0)));
        let on = Sampler::parse("always_on", None).unwrap();
        assert!(on.samples(Some(false), &trace(u64::MAX)));
        let never = Sampler::parse("always_off", None).unwrap();
        assert!(!never.samples(Some(true), &trace(0)));
    }

    /// A ratio records that share of trace ids, decided by the id alone.
    #[test]
    fn a_ratio_records_its_share_of_traces_by_their_id() {
        let quarter = Sampler::parse("traceidratio", Some("0.25")).unwrap();
        assert!(quarter.samples(None, &trace(0)));
        assert!(!quarter.samples(None, &trace(u64::MAX)));
        assert!(quarter.samples(None, &trace((1u64 << 62) - 2)));
        assert!(!quarter.samples(None, &trace((1u64 << 62) + 2)));
        let mut rng = fastrand::Rng::with_seed(7);
        let recorded = (0..20_000)
            .filter(|_| quarter.samples(Some(true), &trace(rng.u64(..))))
            .count();
        assert!((4_600..=5_400).contains(&recorded), "{recorded}");
    }
}

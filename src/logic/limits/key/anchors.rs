//! A key's rate buckets in the sync round's levels (`Bucket::anchor_view`, `Bucket::anchor`,
//! `Bucket::unsettle`): which ask to be anchored, and the anchors applied.

use super::*;
use crate::logic::limits::bucket::AnchorView;

/// The sync round's anchors (`Bucket::anchor_view`, `Bucket::anchor`): the rate buckets the
/// store keeps a site level of, never the daily budgets (their totals are read whole).
impl KeyLimits {
    /// Hand every rate bucket low enough to be anchored to `sink`, with its view.
    pub fn anchor_views(&self, now: Millis, mut sink: impl FnMut(BucketRef, AnchorView)) {
        let mut view = |bucket: BucketRef, found: Option<AnchorView>| {
            if let Some(found) = found {
                sink(bucket, found);
            }
        };
        match &self.shape {
            Shape::Flat { requests, .. } => {
                if let Some(rate) = requests {
                    view(BucketRef::Requests { model: None }, rate.anchor_view(now));
                }
            }
            Shape::PerModel(models) => {
                for limits in models {
                    if let Some(rate) = &limits.requests {
                        let bucket = BucketRef::Requests {
                            model: Some(limits.model),
                        };
                        view(bucket, rate.anchor_view(now));
                    }
                }
            }
        }
        for rates in &self.token_rates {
            let model = rates.model;
            if let Some(input) = &rates.input {
                view(BucketRef::InputTokens { model }, input.anchor_view(now));
            }
            if let Some(output) = &rates.output {
                view(BucketRef::OutputTokens { model }, output.anchor_view(now));
            }
        }
    }

    /// Every rate bucket was just lowered by merged usage (`Bucket::unsettle`).
    pub fn unsettle_rates(&mut self) {
        match &mut self.shape {
            Shape::Flat { requests, .. } => {
                if let Some(rate) = requests {
                    rate.unsettle();
                }
            }
            Shape::PerModel(models) => {
                for limits in models {
                    if let Some(rate) = &mut limits.requests {
                        rate.unsettle();
                    }
                }
            }
        }
        for rates in &mut self.token_rates {
            for rate in [rates.input.as_mut(), rates.output.as_mut()]
                .into_iter()
                .flatten()
            {
                rate.unsettle();
            }
        }
    }

    /// Anchor one rate bucket to the site's level (`Bucket::anchor`). A bucket this key no
    /// longer has (a reload in between) is skipped; a daily one is never anchored.
    pub fn anchor(
        &mut self,
        now: Millis,
        bucket: BucketRef,
        site_units: i64,
        share: Share,
        lower_only: bool,
    ) {
        match bucket {
            BucketRef::Requests { model: None } => {
                if let Shape::Flat {
                    requests: Some(rate),
                    ..
                } = &mut self.shape
                {
                    rate.anchor(now, site_units, share, lower_only);
                }
            }
            BucketRef::Requests { model: Some(model) } => {
                if let Some(rate) = self
                    .model_limits(model)
                    .and_then(|limits| limits.requests.as_mut())
                {
                    rate.anchor(now, site_units, share, lower_only);
                }
            }
            BucketRef::InputTokens { model } | BucketRef::OutputTokens { model } => {
                let input = matches!(bucket, BucketRef::InputTokens { .. });
                if let Some(rates) = self
                    .token_rates
                    .iter_mut()
                    .find(|rates| rates.model == model)
                {
                    let rate = if input {
                        rates.input.as_mut()
                    } else {
                        rates.output.as_mut()
                    };
                    if let Some(rate) = rate {
                        rate.anchor(now, site_units, share, lower_only);
                    }
                }
            }
            BucketRef::Daily { .. } => {}
        }
    }
}

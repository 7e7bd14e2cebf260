//! What the site's rounds take from a key's buckets and give back (seed
//! `run-several-routers.md`, "How it works"): the usage admitted here since the last round
//! (step 1), other routers' usage and a start's replay of it (step 2), and the daily totals the
//! store and the disk database keep. The levels the round anchors the rate buckets to are in
//! `anchors`.

use super::*;

impl KeyLimits {
    /// Hand every non-zero local delta to `sink` (seed `run-several-routers.md`, "How it
    /// works", step 1: publish the usage admitted since the last round).
    pub fn take_deltas(&mut self, mut sink: impl FnMut(BucketRef, u64)) {
        match &mut self.shape {
            Shape::Flat { requests, daily } => {
                if let Some(rate) = requests.as_mut() {
                    emit(
                        &mut sink,
                        BucketRef::Requests { model: None },
                        rate.take_delta(),
                    );
                }
                if let Some(budget) = daily.as_mut() {
                    let (day, tokens) = budget.take_delta();
                    emit(&mut sink, BucketRef::Daily { model: None, day }, tokens);
                }
            }
            Shape::PerModel(models) => {
                for limits in models.iter_mut() {
                    let model = Some(limits.model);
                    if let Some(rate) = limits.requests.as_mut() {
                        emit(&mut sink, BucketRef::Requests { model }, rate.take_delta());
                    }
                    if let Some(budget) = limits.daily.as_mut() {
                        let (day, tokens) = budget.take_delta();
                        emit(&mut sink, BucketRef::Daily { model, day }, tokens);
                    }
                }
            }
        }
        for rates in &mut self.token_rates {
            let model = rates.model;
            if let Some(input) = rates.input.as_mut() {
                emit(
                    &mut sink,
                    BucketRef::InputTokens { model },
                    input.take_delta(),
                );
            }
            if let Some(output) = rates.output.as_mut() {
                emit(
                    &mut sink,
                    BucketRef::OutputTokens { model },
                    output.take_delta(),
                );
            }
        }
    }

    /// Hand every daily budget whose local total changed since the last call to `sink`, as
    /// (flat `None` or the budget's model, day, total): what the disk database must hold
    /// (`HIVENET_ROUTER_QUOTA_BACKEND=badger`). Independent of [`KeyLimits::take_deltas`].
    pub fn take_changed_daily_totals(&mut self, mut sink: impl FnMut(Option<ModelId>, Day, u64)) {
        match &mut self.shape {
            Shape::Flat { daily, .. } => {
                if let Some((day, total)) = daily.as_mut().and_then(DailyBudget::take_changed_total)
                {
                    sink(None, day, total);
                }
            }
            Shape::PerModel(models) => {
                for limits in models.iter_mut() {
                    if let Some((day, total)) = limits
                        .daily
                        .as_mut()
                        .and_then(DailyBudget::take_changed_total)
                    {
                        sink(Some(limits.model), day, total);
                    }
                }
            }
        }
    }

    /// Hand what every daily budget counts of the other routers to `sink`, as (flat `None` or
    /// the budget's model, day, tokens): see [`DailyBudget::others`].
    pub fn daily_others(&self, mut sink: impl FnMut(Option<ModelId>, Day, u64)) {
        match &self.shape {
            Shape::Flat { daily, .. } => {
                if let Some(budget) = daily {
                    let (day, tokens) = budget.others();
                    sink(None, day, tokens);
                }
            }
            Shape::PerModel(models) => {
                for limits in models {
                    if let Some(budget) = &limits.daily {
                        let (day, tokens) = budget.others();
                        sink(Some(limits.model), day, tokens);
                    }
                }
            }
        }
    }

    /// Every daily budget hands its local total out again (see [`DailyBudget::mark_unreported`]).
    pub fn mark_daily_unreported(&mut self) {
        match &mut self.shape {
            Shape::Flat { daily, .. } => {
                if let Some(budget) = daily.as_mut() {
                    budget.mark_unreported();
                }
            }
            Shape::PerModel(models) => {
                for limits in models.iter_mut() {
                    if let Some(budget) = limits.daily.as_mut() {
                        budget.mark_unreported();
                    }
                }
            }
        }
    }

    /// Add a total persisted before a restart to the flat daily budget (`model: None`) or a
    /// per-model one (see [`DailyBudget::restore`]). False when the key has no such budget under
    /// its current quota: the caller keeps the total for a later rebuild.
    pub fn restore_daily(&mut self, model: Option<ModelId>, day: Day, tokens: u64) -> bool {
        match self.daily_bucket_mut(model) {
            Some(budget) => {
                budget.restore(day, tokens);
                true
            }
            None => false,
        }
    }

    /// Set what the other routers charged one daily budget (see
    /// [`DailyBudget::set_others_total`]). False when the key has no such budget.
    pub fn set_others_daily(&mut self, model: Option<ModelId>, day: Day, tokens: u64) -> bool {
        match self.daily_bucket_mut(model) {
            Some(budget) => {
                budget.set_others_total(day, tokens);
                true
            }
            None => false,
        }
    }

    /// Subtract usage another router published for one of this key's buckets (seed
    /// `run-several-routers.md`, "How it works", step 2). Usage for a bucket this key does not
    /// have (its configuration differs, or the model is unlisted) is ignored.
    ///
    /// `age_ms`: how long ago the other router admitted it (see [`super::Bucket::apply_remote`]).
    pub fn apply_remote(
        &mut self,
        now: Millis,
        bucket: BucketRef,
        amount: u64,
        age_ms: u64,
        share: Share,
    ) {
        if let BucketRef::Daily { model, day } = bucket {
            if let Some(budget) = self.daily_bucket_mut(model) {
                budget.apply_remote(day, amount);
            }
        } else if let Some(rate) = self.rate_bucket_mut(now, bucket) {
            rate.apply_remote(now, amount, age_ms, share);
        }
    }

    /// Subtract a start's replay of the other routers' usage of one of this key's rate buckets
    /// (see [`super::Bucket::replay`]): `history` is when each batch was admitted and how much,
    /// oldest first. A daily budget is not replayed (its usage is in the totals read).
    pub fn replay(
        &mut self,
        now: Millis,
        bucket: BucketRef,
        history: &[(Millis, u64)],
        share: Share,
    ) {
        if let Some(rate) = self.rate_bucket_mut(now, bucket) {
            rate.replay(now, history, share);
        }
    }

    /// The rate bucket (requests, input or output tokens per minute) `bucket` names, if this key
    /// has it under its current quota; token-rate buckets are created full on first use.
    fn rate_bucket_mut(&mut self, now: Millis, bucket: BucketRef) -> Option<&mut Bucket> {
        match bucket {
            BucketRef::Requests { model: None } => match &mut self.shape {
                Shape::Flat { requests, .. } => requests.as_mut().map(RequestRate::bucket_mut),
                Shape::PerModel(_) => None,
            },
            BucketRef::Requests { model: Some(model) } => self
                .model_limits(model)
                .and_then(|limits| limits.requests.as_mut())
                .map(RequestRate::bucket_mut),
            BucketRef::Daily { .. } => None,
            BucketRef::InputTokens { model } | BucketRef::OutputTokens { model } => {
                let index = self.token_rates_index(now, model).ok()??;
                let rates = &mut self.token_rates[index];
                let rate = if matches!(bucket, BucketRef::InputTokens { .. }) {
                    rates.input.as_mut()
                } else {
                    rates.output.as_mut()
                };
                rate.map(TokenRate::bucket_mut)
            }
        }
    }
}

fn emit(sink: &mut impl FnMut(BucketRef, u64), bucket: BucketRef, amount: u64) {
    if amount > 0 {
        sink(bucket, amount);
    }
}

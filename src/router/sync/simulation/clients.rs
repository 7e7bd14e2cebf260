//! The clients: each live router is offered its load of the rate key and the daily key every
//! step, and what it admitted settles when the response ends (the daily charges by day and
//! step, for invariants 1 and 4).

use super::*;

impl Sim {
    /// Clients: each live router is offered its load of both keys.
    pub(super) fn arrive(&mut self) -> [u64; ROUTERS] {
        let mut admitted = [0u64; ROUTERS];
        for index in 0..ROUTERS {
            let Some(router) = self.routers[index].as_mut() else {
                continue;
            };
            let now = Millis(self.now);
            let day = router.day(self.now);
            for _ in 0..self.offered[index][0] {
                let shard = &mut router.shards[owner_shard(&self.registry, self.rate_key)];
                if shard
                    .admit(
                        now,
                        day,
                        &self.registry,
                        &self.snapshot,
                        self.rate_key,
                        &CHAT,
                        Charge::RequestsOnly,
                    )
                    .is_ok()
                {
                    admitted[index] += 1;
                    router.unpublished += 1;
                    // Restarted while the store does not answer: it enforces its share of a
                    // full bucket, not knowing what the others used (seed: "Router starts while
                    // the store is unreachable").
                    if router.restarted
                        && matches!(router.health.share(), Share::Alone { since: 0, .. })
                    {
                        self.cold_starts.entry(router.run).or_insert(self.step);
                    }
                }
            }
            for _ in 0..self.offered[index][1] {
                let shard = &mut router.shards[owner_shard(&self.registry, self.daily_key)];
                let admitted = shard.admit(
                    now,
                    day,
                    &self.registry,
                    &self.snapshot,
                    self.daily_key,
                    &CHAT,
                    Charge::RequestsAndTokens(Estimate {
                        input_tokens: INPUT,
                        max_output_tokens: Some(MAX_OUTPUT),
                    }),
                );
                if let Ok(admitted) = admitted
                    && let Some(admission) = admitted.admission
                {
                    // The budget counts on the day it is at: a router whose clock is behind
                    // midnight counts on the day the others already reached.
                    let tenant = self
                        .registry
                        .get(self.daily_key)
                        .expect("the key")
                        .tenant_id;
                    let day = shard.daily_day(tenant).unwrap_or(day).max(day);
                    *self.daily_charged.entry(day.0).or_default() += INPUT;
                    *self.truth.charged.entry((router.run, day.0)).or_default() += INPUT as i64;
                    charge_step(&mut self.daily_by_step, day, self.step, INPUT as i64);
                    if let Some(outage) = &mut self.outage[index] {
                        outage.charge(day, INPUT as i64, self.daily);
                    }
                    let input = INPUT - 10 + self.rng.below(21);
                    let output = self.rng.below(MAX_OUTPUT + 1);
                    let delivery = if self.rng.chance(500) {
                        Delivery::Streamed
                    } else {
                        Delivery::Buffered
                    };
                    router.in_flight.push(InFlight {
                        settle_at: self.now + STEP_MS * (1 + self.rng.below(20)),
                        admission,
                        input,
                        output,
                        delivery,
                        day,
                    });
                }
            }
        }
        admitted
    }

    pub(super) fn settle(&mut self) {
        for index in 0..ROUTERS {
            let Some(router) = self.routers[index].as_mut() else {
                continue;
            };
            let now = self.now;
            let day = router.day(now);
            let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut router.in_flight)
                .into_iter()
                .partition(|request| request.settle_at <= now);
            router.in_flight = waiting;
            let tenant = self
                .registry
                .get(self.daily_key)
                .expect("the daily key")
                .tenant_id;
            let shard = &mut router.shards[tenant.owner(SHARDS)];
            for request in due {
                let settlement = shard.settle(
                    Millis(now),
                    day,
                    tenant,
                    request.admission,
                    UsedTokens {
                        input_tokens: request.input,
                        output_tokens: request.output,
                    },
                    request.delivery,
                );
                // A buffered answer whose output no longer fits is refused, its output not
                // charged; a stream's output is charged whatever is left.
                let fit = settlement.is_none_or(|settlement| settlement.output_fit);
                let output = if fit || request.delivery == Delivery::Streamed {
                    request.output
                } else {
                    0
                };
                // The input true-up belongs to the day of admission, if it is still the day the
                // budget counts.
                let day = shard.daily_day(tenant).unwrap_or(day).max(day);
                let mut charged = output as i64;
                if request.day == day {
                    charged += request.input as i64 - INPUT as i64;
                }
                let total = self.daily_charged.entry(day.0).or_default();
                *total = total.saturating_add_signed(charged);
                *self.truth.charged.entry((router.run, day.0)).or_default() += charged;
                charge_step(&mut self.daily_by_step, day, self.step, charged);
                if let Some(outage) = &mut self.outage[index] {
                    outage.charge(day, charged, self.daily);
                }
            }
        }
    }
}

impl Sim {
    /// Records the requests in flight in the step `day`'s charges first reach the budget.
    pub(super) fn note_exhaustion(&mut self) {
        let Some((&day, _)) = self.daily_charged.iter().rev().find(|(day, charged)| {
            **charged >= self.daily && !self.in_flight_at_exhaustion.contains_key(day)
        }) else {
            return;
        };
        let in_flight = self
            .routers
            .iter()
            .flatten()
            .flat_map(|router| &router.in_flight)
            .filter(|request| request.day.0 == day)
            .count() as u64;
        self.in_flight_at_exhaustion.insert(day, in_flight);
    }
}

/// Adds a charge to step `step` of `day` (negative charges, input true-ups, count as none).
fn charge_step(by_step: &mut BTreeMap<u32, Vec<u64>>, day: Day, step: usize, charged: i64) {
    let steps = by_step.entry(day.0).or_default();
    if steps.len() <= step {
        steps.resize(step + 1, 0);
    }
    steps[step] += charged.max(0) as u64;
}

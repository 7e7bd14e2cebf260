//! The round's part in the site's levels of contended rate buckets (`sync::levels`): the asks
//! from the shards' views, the buckets of the levels returned for this round's usage, the
//! anchors handed back to the shards; and, after the store lost its data, the rows of this
//! router's memory of the others' daily usage (`daily_fields::daily_records`).

use super::*;

impl Round {
    /// This round's asks, from the shards' views, each with the anchor its answer makes.
    /// Buckets of models this router no longer knows by name are left out.
    pub(super) fn asks(&mut self) -> (Vec<Ask>, Vec<Anchor>) {
        let registry = self.shared.registry();
        std::mem::take(&mut self.views)
            .into_iter()
            .filter_map(|view| {
                let (kind, model) = levels::kind_of(view.bucket)?;
                let model = match model {
                    None => None,
                    Some(model) => Some(registry.model_key(model).map(|key| ModelName {
                        name: key.name,
                        capability: key.capability,
                    })?),
                };
                let ask = Ask {
                    key: view.key,
                    kind,
                    model,
                    view: view.view,
                };
                let anchor = Anchor {
                    key: view.key,
                    bucket: view.bucket,
                    site_units: 0,
                    lower_only: false,
                };
                Some((ask, anchor))
            })
            .unzip()
    }

    /// The buckets of the levels the script returned for this round's usage, by field; read
    /// before the backlog is cleared.
    pub(super) fn published_fields(
        &self,
        answers: Option<&levels::Answers>,
    ) -> HashMap<String, (KeyId, BucketRef)> {
        match answers {
            Some(answers) if !answers.published.is_empty() => {
                let registry = self.shared.registry();
                levels::fields_of(self.backlog.batches(), |model| {
                    registry.model_key(model).map(|key| ModelName {
                        name: key.name,
                        capability: key.capability,
                    })
                })
            }
            _ => HashMap::new(),
        }
    }

    /// The anchors for the shards: the answers to the asks, then the levels of the tracked
    /// buckets this round used. None while an entry written without the levels was read less
    /// than [`levels::UNLEVELLED_HOLD_MS`] ago.
    pub(super) fn anchors(
        &mut self,
        now_ms: u64,
        unlevelled: bool,
        answers: Option<levels::Answers>,
        asked: Vec<Anchor>,
        published: &HashMap<String, (KeyId, BucketRef)>,
    ) -> Vec<Anchor> {
        if unlevelled {
            self.unlevelled_until = now_ms + levels::UNLEVELLED_HOLD_MS;
        }
        let lower_only = self.anchor_lower_only_rounds > 0;
        self.anchor_lower_only_rounds = self.anchor_lower_only_rounds.saturating_sub(1);
        match answers {
            Some(answers) if now_ms >= self.unlevelled_until => {
                let mut anchors = levels::anchors(asked, answers, published);
                for anchor in &mut anchors {
                    anchor.lower_only = lower_only;
                }
                anchors
            }
            _ => Vec::new(),
        }
    }

    /// This router's memory of the others' daily usage as the round writes it: (day, this
    /// router's field of the budget, tokens).
    pub(super) fn memory_rows(&self, memory: &[DailyTotal]) -> Vec<(u32, String, u64)> {
        let registry = self.shared.registry();
        memory
            .iter()
            .filter_map(|total| {
                let (field, _) = self.budget_field(&registry, total)?;
                Some((total.day.0, field, total.tokens))
            })
            .collect()
    }
}

//! What routers exchange about quotas in the sync round (seed `run-several-routers.md`, "How it
//! works", steps 1 and 2): one bucket's usage ([`BucketUsage`]), and the batches of the other
//! routers' usage the sync core hands every shard ([`RemoteUsage`]). The parent's `Quotas` hands
//! out the one (`take_usage`) and subtracts the other (`apply_remote`).
//!
//! Usage names its holder by ids every router of a site derives the same way from the keys
//! (`TenantId`, `KeyId`); models stay this process's `ModelId` here, and the sync core turns them
//! into names before anything leaves the router.
//!
//! Must not: reach a holder. This is plain data.

use crate::base::ids::KeyId;
use crate::logic::limits::BucketRef;
use crate::logic::limits::bucket::AnchorView;

/// One bucket's usage as routers exchange it. Request and daily buckets belong to the holder of
/// the key's owner (`key` is a key of that owner that used them: every router finds the owner,
/// and builds the holder where it is unknown, from it); input and output token buckets to the
/// key's own holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketUsage {
    pub key: KeyId,
    pub bucket: BucketRef,
    pub amount: u64,
}

impl BucketUsage {
    /// Whether the bucket is one of the key's own (B4 token rates) rather than its owner's.
    pub fn is_key_bucket(&self) -> bool {
        matches!(
            self.bucket,
            BucketRef::InputTokens { .. } | BucketRef::OutputTokens { .. }
        )
    }
}

/// A rate bucket low enough for the round to anchor it to the site's level the store keeps
/// (`Bucket::anchor_view`): which one, and this router's view of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketView {
    pub key: KeyId,
    pub bucket: BucketRef,
    pub view: AnchorView,
}

/// The site's level of one rate bucket, as the store counted it when the round ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    pub key: KeyId,
    pub bucket: BucketRef,
    pub site_units: i64,
    /// The site's level may only lower the bucket (`Bucket::anchor`): for a few rounds after a
    /// failover, when the store's levels may miss decrements.
    pub lower_only: bool,
}

impl Anchor {
    /// See [`BucketUsage::is_key_bucket`].
    pub fn is_key_bucket(&self) -> bool {
        matches!(
            self.bucket,
            BucketRef::InputTokens { .. } | BucketRef::OutputTokens { .. }
        )
    }
}

/// Usage other routers published, as the sync core hands it to every shard; each applies the
/// usage of the tenants it owns.
#[derive(Debug, Default)]
pub struct RemoteUsage {
    /// Batches of usage admitted at one time, with how long ago that was.
    pub batches: Vec<RemoteBatch>,
    /// The site's levels of the buckets this router asked to anchor, applied after the batches:
    /// they count every entry the round read.
    pub anchors: Vec<Anchor>,
    /// The batches replay the last minute at a start: each rate bucket's usage is walked in
    /// admission order (`Quotas::replay`), not subtracted batch by batch.
    pub replay: bool,
    /// The replay came after the router ran alone a while: the buckets it lowers are unsettled
    /// (`Bucket::unsettle`), a minute of usage taken at once on a bucket that this router used
    /// and that refilled meanwhile.
    pub unsettle: bool,
}

#[derive(Debug)]
pub struct RemoteBatch {
    pub age_ms: u64,
    pub usage: Vec<BucketUsage>,
}

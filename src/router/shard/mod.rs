//! The data plane: what each shard owns and how a request asks for it.
//!
//! Ownership: a model's routes, occupancy and hold book live on shard `model id % shards`
//! (`ids::ModelId::owner`), a tenant's quota holder on `tenant id % shards`, a redirect nonce on
//! `nonce[0] % shards`. Both ids are dense or hash-derived, so ownership spreads evenly. A
//! client connection whose first request's key is limited moves once, to the key's owner, while
//! that owner is not much busier (`handoff`); otherwise it stays on the shard that accepted it for
//! its whole life (`front`), and so does its response stream: each shard has its own tunnel
//! connection to every agent.
//!
//! Modules, one job each:
//! - `owner`: what a shard owns, as pure state machines (`Models`, `Quotas`, spent tokens) that
//!   serve a `Visit`, apply a `Notice` and leave answers for others in `Effects`; no I/O, no
//!   clock, tested in virtual time.
//! - `visit`: the requester side: one visit path (inline for a local owner, over the mesh
//!   otherwise), one waiter table, and the operations requests use (`acquire`, `reserve`,
//!   `hold`, `admit_quota`, `spend_redirect_token`).
//! - `waiters`: the requester's table of visits waiting for answers, with their deadlines
//!   (one deadline task per shard, no timer per wait).
//! - `guards`: what a request holds (`Slot`, `Reservation`, `Pending`, `QuotaCharge`), given back
//!   exactly once when dropped.
//! - `state`: the `Shard` itself: its settings, its view of the configuration, running the
//!   owner on the real clock and delivering its effects, counters, tunnels.
//! - `inbox`: the control core's messages and other shards' mesh messages, each applied by one
//!   dispatch function.
//! - `outbox`, `mesh`: sending to other shards (SPSC rings, bounded deferral).
//! - `messages`: what flows between the control core and the shards, and between shards;
//!   `queues`: the bounded queues that carry it between the cores, and what a full one means.
//! - `tunnels`: the shard's end of the agent tunnels the control core hands it; `conn_limit`:
//!   open tunnel connections per source.
//! - `redirect_claims`: the shards' handle on the site-wide single use of redirect tokens (the
//!   sync core serves it); `registration_feed`: the agents joining and leaving the pool, as a
//!   shard streams them to `/admin/registration-stream` subscribers.
//! - `handoff`: a client connection given to the shard that owns its key, and when that is worth
//!   it; `connection_moves`: the giving shard's side of it.
//! - `clients`: what one shard's clients may hold (connections, body bytes, resets per source).
//! - `lifecycle`: draining and ending on SIGTERM.
//!
//! Dependencies point down (`tests/architecture.rs`): `front`, `api`, the sync core and the
//! control core use this module; it uses the router's services (accounting, metrics,
//! configuration, providers), `net`, `logic`, `wire` and `base`, never a core above it.

pub mod clients;
pub mod conn_limit;
pub mod connection_moves;
pub mod guards;
pub mod handoff;
pub mod inbox;
pub mod lifecycle;
pub mod mesh;
pub mod messages;
pub mod outbox;
pub mod owner;
pub mod queue_waits;
pub mod queues;
pub mod redirect_claims;
pub mod registration_feed;
pub mod state;
pub mod timer;
pub mod tunnels;
pub mod visit;
pub mod waiters;

pub use crate::base::ids::IdMap;

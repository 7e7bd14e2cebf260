//! The client-facing front of each shard: its thread and runtime, its listener, and the HTTP/1.1
//! and h2c connections it reads requests from and hands to `api`.
//!
//! - `runtime`: one pinned `monoio` runtime per shard, its SO_REUSEPORT listener, its background
//!   tasks (control inbox, mesh, cleanup) and where tunnel sockets go (`shard::tunnels::start`).
//! - `connection`: an HTTP/1.1 connection (keep-alive, bodies, limits), upgraded to h2c on a
//!   preface.
//! - `h2c`: an HTTP/2 (cleartext) connection, one task per stream.
//! - `handoff`: a connection's move to the shard that owns its key (`--connection-handoff`).
//! - `pipeline`: the queue from an HTTP/1.1 connection's reader to its writer.
//!
//! This layer sits on top: it depends on `api` and `shard`, and neither depends on it.

pub mod connection;
pub mod h2c;
mod handoff;
mod pipeline;
pub mod runtime;
pub mod writer;

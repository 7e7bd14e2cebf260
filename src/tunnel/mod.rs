//! The data tunnel between a router shard and an agent: an agent-dialed TCP socket, authenticated by
//! the preamble, then HTTP/2 with the router as client.

pub mod client;
pub mod preamble;
pub mod tls;

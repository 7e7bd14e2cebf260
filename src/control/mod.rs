//! The control core: a small `tokio` runtime on its own thread that runs the agent gRPC service,
//! the tunnel acceptor, agent health checks and the Prometheus endpoint, and tells shards what
//! changed. Nothing here is on the request path.

pub mod registry;

//! Wire formats: the HTTP/1.1 codec and body-field extraction, and the agent control protocol
//! generated from `proto/hivenet.proto`. Imports only `base`.

pub mod http;
pub mod proto {
    //! Generated from `proto/hivenet.proto`.
    tonic::include_proto!("hivenet.v1");
}

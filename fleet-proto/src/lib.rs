//! The service of tonic-balancer's test fleet, demo and benchmarks (`proto/fleet.proto`), and
//! a user's service as in tonic's helloworld (`proto/helloworld.proto`, in the fleet crate's
//! tests), compiled at build time with protox (a protobuf compiler in pure Rust, no system
//! `protoc`). A dev-dependency: the library and the fleet crate have no generated code.
#![allow(missing_docs)]

tonic::include_proto!("fleet.v1");

/// A user's service, as in tonic's helloworld example.
pub mod helloworld {
    tonic::include_proto!("helloworld");
}

/// The service of the test peers (`proto/peer.proto`): grpc-go and grpcio servers that the tests
/// start as processes (`fleet_service::peers`).
pub mod peer {
    tonic::include_proto!("peer");
}

//! The service of tonic-balancer's test fleet, demo and benchmarks (`proto/fleet.proto`),
//! compiled at build time with protox (a protobuf compiler in pure Rust, no system `protoc`).
//! A dev-dependency: the library itself has no generated code.
#![allow(missing_docs)]

tonic::include_proto!("fleet.v1");

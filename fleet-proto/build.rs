//! Compiles `proto/fleet.proto` (the test fleet's and the demo's service) and
//! `proto/helloworld.proto` (a user's service, in the fleet crate's tests) and `proto/peer.proto`
//! (the service of the test peers, servers of other gRPC implementations) with protox, a
//! protobuf compiler in pure Rust, so that no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        [
            "proto/fleet.proto",
            "proto/helloworld.proto",
            "proto/peer.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}

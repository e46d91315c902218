//! Generates the kubelet plugin gRPC code (registration, DRA, DRA health) from `proto/`.
//! protox parses the .proto files in-process, so building needs no system `protoc`.

use std::error::Error;

const PROTO_ROOT: &str = "proto";
const PROTO_FILES: &[&str] = &[
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra-health/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={PROTO_ROOT}/{file}");
    }
    let descriptors = protox::compile(PROTO_FILES, [PROTO_ROOT])?;
    // Clients are generated too: tests and the kubelet simulator side of our own tests use them.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}

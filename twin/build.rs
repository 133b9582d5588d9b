//! Generates KubeEdge's DMI v1beta1 (`proto/dmi/v1beta1/api.proto`)
//! without protoc: protox parses the file in Rust, tonic-prost-build writes
//! the messages, the edge's server (DeviceManagerService) and the mapper
//! client (DeviceMapperService), as edged does for CRI.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/dmi/v1beta1/api.proto");
    let descriptors = protox::compile(["dmi/v1beta1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}

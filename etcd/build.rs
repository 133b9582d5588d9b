//! Generates etcd's v3 gRPC client from `proto/` without protoc: protox
//! parses the files in Rust, tonic-prost-build writes the code (as edged
//! does for CRI).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["etcd/api/etcdserverpb/rpc.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}

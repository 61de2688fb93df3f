//! Compiles `proto/streamgate/v1/*.proto` with protox (a pure-Rust protobuf compiler), so
//! a fresh machine needs no system `protoc`. Also writes the descriptor set that gRPC
//! reflection serves.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "streamgate/v1/event.proto",
        "streamgate/v1/ingest.proto",
        "streamgate/v1/archive.proto",
        "streamgate/v1/projector.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("streamgate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}

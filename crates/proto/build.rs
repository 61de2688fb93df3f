//! Compiles `proto/streamgate/v1/*.proto` with protox (a pure-Rust protobuf compiler), so
//! a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = ["streamgate/v1/event.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}

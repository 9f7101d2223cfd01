//! Compiles `csi/v1/csi.proto` and `pluginregistration/v1/api.proto` with `protoc` (Debian's `protobuf-compiler`; set `PROTOC` to use another).
//!
//! `third_party/` holds the two well-known types csi.proto imports, so libprotobuf-dev is not needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csi/v1/csi.proto");
    println!("cargo:rerun-if-changed=pluginregistration/v1/api.proto");
    println!("cargo:rerun-if-changed=third_party");
    println!("cargo:rerun-if-env-changed=PROTOC");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["csi/v1/csi.proto", "pluginregistration/v1/api.proto"], &[".", "third_party"])?;
    Ok(())
}

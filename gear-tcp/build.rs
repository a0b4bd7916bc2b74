//! Generates the gRPC code from `proto/gear_data.proto` with a vendored
//! `protoc`, so building needs nothing installed by hand.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/gear_data.proto");
    tonic_build::configure().compile_protos(&["proto/gear_data.proto"], &["proto"])?;
    Ok(())
}

//! Generates the gRPC code from `proto/gear.proto` with a vendored `protoc`,
//! so building needs nothing installed by hand.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/gear.proto");
    // Trajectory and window bytes decode as `Bytes` slices of the received
    // buffer instead of being copied into fresh vectors.
    tonic_build::configure()
        .bytes([".gear.v1.InsertChunk.columns", ".gear.v1.SampleReply.columns"])
        // Encode buffers sized to the message first (src/codec.rs).
        .codec_path("crate::codec::SizedProstCodec")
        .compile_protos(&["proto/gear.proto"], &["proto"])?;
    Ok(())
}

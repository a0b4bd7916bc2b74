//! Generates the gRPC code from `proto/gear.proto` with a vendored `protoc`,
//! so building needs nothing installed by hand.
//!
//! Two passes over the one proto: the messages and the client, then the
//! server alone, whose `Sample` replies are the crate's `SampleReplyOut`
//! (a `SampleReply` the shard may still have to draw and gather, which it
//! does while tonic encodes it: `src/server/reply.rs`). Both use the same
//! messages and the codec of `src/codec.rs`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/gear.proto");
    // Trajectory and window bytes decode as `Bytes` slices of the received
    // buffer instead of being copied into fresh vectors.
    tonic_build::configure()
        .build_server(false)
        .bytes([".gear.v1.InsertChunk.columns", ".gear.v1.SampleReply.columns"])
        // Encode buffers sized to the message first (src/codec.rs).
        .codec_path("crate::codec::SizedProstCodec")
        .compile_protos(&["proto/gear.proto"], &["proto"])?;
    let server_dir = PathBuf::from(std::env::var("OUT_DIR")?).join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_build::configure()
        .build_client(false)
        .out_dir(&server_dir)
        .extern_path(".gear.v1", "crate::proto")
        .extern_path(".gear.v1.SampleReply", "crate::server::SampleReplyOut")
        .codec_path("crate::codec::SizedProstCodec")
        .compile_protos(&["proto/gear.proto"], &["proto"])?;
    Ok(())
}

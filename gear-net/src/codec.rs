//! The `gear.v1.Shard` service's codec: prost's, except that the encode
//! buffer is sized to the whole message before prost writes into it.
//!
//! tonic's prost encoder lets the buffer grow as fields are written. A
//! sample reply's window bytes (field 8) are followed by small fields
//! (size and masses, 9 to 11), and an insert chunk's trajectory bytes
//! (field 2) by its priority and end flag: each small field after the bulk
//! one made the buffer double, copying every byte already written into a
//! new allocation. Above glibc's largest mmap threshold (32 MiB: a 16 MiB
//! batch from one shard doubles to 32 MiB + 4 KiB) that allocation was also
//! mapped, faulted in page by page and unmapped on every reply (seen with
//! `strace` on a shard server under `gear bench --shards 1`). Reserving
//! `encoded_len()` first makes the encode one copy into one allocation.
//! Decoding is prost's, unchanged (tonic already reserves a message's
//! length when it reads its header).
//!
//! What the codec sends is an [`OutgoingMessage`]: every prost message is
//! one, and so is the shard server's
//! [`SampleReplyOut`](crate::server::SampleReplyOut), which draws and
//! gathers its rows straight into the encode buffer.

use bytes::BufMut;
use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// prost encoding into a buffer reserved to the message's size (see the
/// module doc); named by `build.rs` as the services' `codec_path`.
#[derive(Debug, Clone)]
pub struct SizedProstCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for SizedProstCodec<T, U> {
    fn default() -> Self {
        SizedProstCodec { _messages: PhantomData }
    }
}

/// A message the codec can send: writes its protobuf encoding into tonic's
/// encode buffer.
pub trait OutgoingMessage: Send + 'static {
    /// Appends this message's encoding to `buf`.
    fn encode_to(self, buf: &mut EncodeBuf<'_>) -> Result<(), Status>;
}

impl<T: Message + 'static> OutgoingMessage for T {
    fn encode_to(self, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode_sized(&self, buf)
    }
}

/// Encodes `message` with prost after reserving its encoded length.
pub fn encode_sized<M: Message>(message: &M, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
    let len = message.encoded_len();
    buf.reserve(len);
    debug_assert!(buf.remaining_mut() >= len);
    message.encode(buf).map_err(|e| Status::internal(format!("encoding a {len}-byte message: {e}")))
}

/// Encodes a `T` (see [`OutgoingMessage`]).
#[derive(Debug, Clone, Default)]
pub struct SizedProstEncoder<T> {
    _message: PhantomData<T>,
}

impl<T: OutgoingMessage> Encoder for SizedProstEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode_to(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Decodes `U` as tonic's prost decoder does (a malformed message is
/// `Internal`, with prost's reason).
#[derive(Debug, Clone, Default)]
pub struct SizedProstDecoder<U> {
    _message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for SizedProstDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

impl<T, U> Codec for SizedProstCodec<T, U>
where
    T: OutgoingMessage,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedProstEncoder<T>;
    type Decoder = SizedProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedProstEncoder { _message: PhantomData }
    }

    fn decoder(&mut self) -> Self::Decoder {
        SizedProstDecoder { _message: PhantomData }
    }
}

//! What a failed insert stream had already committed.
//!
//! The server commits each trajectory when its `end` chunk arrives, so a
//! stream that fails part way (a refused chunk, a stream cut off) leaves the
//! trajectories before the failure stored and the open one abandoned (its
//! slot is released; a half trajectory is never visible). The error status
//! then carries, in its binary details, an encoded [`InsertReply`] with the
//! keys committed so far, so the client can tell an actor what landed. The
//! details travel in an HTTP/2 header, so they are capped at
//! [`MAX_DETAIL_BYTES`]; the client keeps its streams short enough
//! (`TRAJECTORIES_PER_STREAM` in the client) that the keys always fit.

use crate::proto::{InsertReply, Key};
use prost::Message;
use tonic::Status;

/// Largest details attached to a failed insert's status: with base64 and
/// the other headers this stays under the 16 KiB header list that HTTP/2
/// clients accept by default.
pub const MAX_DETAIL_BYTES: usize = 8 << 10;

/// Server side: `status`, with the keys committed before it attached.
pub(crate) fn failed(status: Status, keys: &[Key], steps: u64) -> Status {
    if keys.is_empty() {
        return status;
    }
    let details = InsertReply { keys: keys.to_vec(), steps }.encode_to_vec();
    let message = format!("{} ({} trajectories of this stream committed before it)", status.message(), keys.len());
    if details.len() > MAX_DETAIL_BYTES {
        return Status::new(status.code(), format!("{message}; too many keys to list"));
    }
    Status::with_details(status.code(), message, details.into())
}

/// Client side: the keys a failed stream committed, as the server reported
/// them (none when the status carries no, or unreadable, details).
pub(crate) fn committed_keys(status: &Status) -> Vec<Key> {
    InsertReply::decode(status.details()).map(|r| r.keys).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_the_status() {
        let keys: Vec<Key> =
            (0..3).map(|i| Key { shard: 1, incarnation: u64::MAX - 7, slot: i, generation: 2 * i }).collect();
        let s = failed(Status::invalid_argument("chunk 3: bad size"), &keys, 12);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("3 trajectories"), "{}", s.message());
        assert_eq!(committed_keys(&s), keys);
        assert!(committed_keys(&Status::unavailable("gone")).is_empty());
        assert!(committed_keys(&Status::with_details(tonic::Code::Internal, "x", vec![0xff; 9].into())).is_empty());
        // Too many keys for a header: the status says so and lists none.
        let many: Vec<Key> =
            (0..2000).map(|i| Key { shard: 1, incarnation: u64::MAX, slot: i, generation: i }).collect();
        let s = failed(Status::aborted("x"), &many, 1);
        assert!(s.details().is_empty() && s.message().contains("too many keys"));
    }
}

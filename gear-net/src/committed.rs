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
//!
//! A stream that ended because the shard could not begin its next
//! trajectory within the stream's begin wait (the rate limiter held it
//! back) says so in the same details (`held`): nothing after the
//! committed keys was stored, and a client that spreads its writes may
//! send the rest to another shard.

use crate::proto::{InsertReply, Key};
use prost::Message;
use tonic::Status;

/// Largest details attached to a failed insert's status: with base64 and
/// the other headers this stays under the 16 KiB header list that HTTP/2
/// clients accept by default.
pub const MAX_DETAIL_BYTES: usize = 8 << 10;

/// Server side: `status`, with the keys committed before it attached.
pub(crate) fn failed(status: Status, keys: &[Key], steps: u64) -> Status {
    with_details(status, keys, steps, false)
}

/// Server side: `status` (a begin wait that ran out) marked as a held
/// trajectory, with the keys committed before it attached.
pub(crate) fn held(status: Status, keys: &[Key], steps: u64) -> Status {
    with_details(status, keys, steps, true)
}

fn with_details(status: Status, keys: &[Key], steps: u64, held: bool) -> Status {
    if keys.is_empty() && !held {
        return status;
    }
    let details = InsertReply { keys: keys.to_vec(), steps, held }.encode_to_vec();
    let message = match keys.len() {
        0 => status.message().to_owned(),
        n => format!("{} ({n} trajectories of this stream committed before it)", status.message()),
    };
    if details.len() > MAX_DETAIL_BYTES {
        let details = InsertReply { keys: Vec::new(), steps, held }.encode_to_vec();
        return Status::with_details(status.code(), format!("{message}; too many keys to list"), details.into());
    }
    Status::with_details(status.code(), message, details.into())
}

/// Client side: the keys a failed stream committed, as the server reported
/// them (none when the status carries no, or unreadable, details).
pub(crate) fn committed_keys(status: &Status) -> Vec<Key> {
    InsertReply::decode(status.details()).map(|r| r.keys).unwrap_or_default()
}

/// Client side: whether a failed stream ended on a trajectory the shard
/// held back (see the module doc).
pub(crate) fn was_held(status: &Status) -> bool {
    InsertReply::decode(status.details()).is_ok_and(|r| r.held)
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
        assert!(committed_keys(&s).is_empty() && s.message().contains("too many keys"));
        assert!(!was_held(&s));
    }

    #[test]
    fn a_held_trajectory_is_marked_with_or_without_keys() {
        let none = held(Status::deadline_exceeded("rate limiter"), &[], 0);
        assert!(was_held(&none) && committed_keys(&none).is_empty());
        assert_eq!(none.message(), "rate limiter");
        let key = Key { shard: 2, incarnation: 5, slot: 1, generation: 1 };
        let one = held(Status::deadline_exceeded("rate limiter"), &[key], 3);
        assert!(was_held(&one));
        assert_eq!(committed_keys(&one), vec![key]);
        assert!(!was_held(&failed(Status::deadline_exceeded("x"), &[key], 3)));
        assert!(!was_held(&Status::deadline_exceeded("x")));
        let many: Vec<Key> = (0..2000).map(|i| Key { shard: 1, incarnation: 1, slot: i, generation: i }).collect();
        assert!(was_held(&held(Status::deadline_exceeded("x"), &many, 1)));
    }
}

//! Futures run side by side without a task or a box each.
//!
//! `FuturesUnordered` allocates a node per future it is given, which a
//! cross-shard batch paid per shard and per batch. [`run_all`] keeps up
//! to [`INLINE`] futures in an array on its own (pinned) future and polls
//! them all whenever it is woken, which for the few shards of one batch
//! costs less than keeping track of which one woke it.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;

/// Futures [`run_all`] keeps without allocating; more go to the heap.
pub(crate) const INLINE: usize = 8;

/// Runs `futures` concurrently until every one is done, pushing each
/// output into `done` as its future ends (in the order they end).
pub(crate) async fn run_all<F: Future>(futures: impl IntoIterator<Item = F>, done: &mut Vec<F::Output>) {
    let mut inline: [Option<F>; INLINE] = std::array::from_fn(|_| None);
    let mut spilled = Vec::new();
    for (i, future) in futures.into_iter().enumerate() {
        match inline.get_mut(i) {
            Some(slot) => *slot = Some(future),
            None => spilled.push(Some(future)),
        }
    }
    let mut inline = pin!(inline);
    let mut spilled: Pin<Box<[Option<F>]>> = Box::into_pin(spilled.into_boxed_slice());
    std::future::poll_fn(|cx| {
        let mut pending = false;
        // SAFETY: seeing the pinned array as a slice moves none of its
        // elements.
        let inline_slots = unsafe { inline.as_mut().map_unchecked_mut(|a| a.as_mut_slice()) };
        pending |= poll_slots(inline_slots, cx, done);
        pending |= poll_slots(spilled.as_mut(), cx, done);
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}

/// Polls every future left in `slots`, taking out those that end; whether
/// any is still pending.
fn poll_slots<F: Future>(
    mut slots: Pin<&mut [Option<F>]>,
    cx: &mut std::task::Context<'_>,
    done: &mut Vec<F::Output>,
) -> bool {
    let mut pending = false;
    for i in 0..slots.len() {
        // SAFETY: the slot is projected from the pinned slice and never
        // moved out of: its future is polled in place and dropped in place
        // (`set(None)`).
        let mut slot = unsafe { slots.as_mut().map_unchecked_mut(|s| &mut s[i]) };
        let Some(future) = slot.as_mut().as_pin_mut() else { continue };
        match future.poll(cx) {
            Poll::Ready(output) => {
                slot.set(None);
                done.push(output);
            }
            Poll::Pending => pending = true,
        }
    }
    pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn every_future_runs_to_its_end_in_the_order_they_end() {
        for n in [0usize, 1, 3, INLINE, INLINE + 5] {
            let dropped = AtomicUsize::new(0);
            struct Count<'a>(&'a AtomicUsize);
            impl Drop for Count<'_> {
                fn drop(&mut self) {
                    self.0.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut done = Vec::new();
            let futures = (0..n).map(|i| {
                let guard = Count(&dropped);
                async move {
                    let _guard = guard;
                    // The later futures end first.
                    tokio::time::sleep(Duration::from_millis(3 * (n - i) as u64)).await;
                    i
                }
            });
            run_all(futures, &mut done).await;
            assert_eq!(done, (0..n).rev().collect::<Vec<_>>(), "{n} futures");
            assert_eq!(dropped.load(Ordering::Relaxed), n, "each future dropped once it ended");
        }
    }
}

//! Driving the reads: chains posted to queue pairs, completions handled,
//! failed pieces retried or failed, and retired queue pairs drained and
//! destroyed.

use gear_core::Ticket;

use crate::verbs::{CompletionStatus, QueuePairId, ReadRequest, Verbs, WorkCompletion};

use crate::config::INDEX_BITS;

use super::{Chain, ClientState, CoreResult, PieceState, RdmaTransport};

impl<V: Verbs> RdmaTransport<V> {
    /// Moves pieces of `ticket` to new chains on the connection's live
    /// queue pairs; fails them when none is left.
    pub(super) fn requeue(&self, st: &mut ClientState, ticket_id: u64, mut pieces: Vec<usize>) {
        // Pieces that landed before their queue pair was retired stay done.
        match st.tickets.get(&ticket_id) {
            Some(t) => pieces.retain(|&p| t.states.get(p) == Some(&PieceState::InFlight)),
            None => pieces.clear(),
        }
        if pieces.is_empty() {
            return;
        }
        let Some(conn_id) = st.tickets.get(&ticket_id).map(|t| t.connection) else { return };
        let live: Vec<u32> = st
            .connections
            .get(&conn_id)
            .map(|c| c.queue_pairs.iter().copied().filter(|q| st.queue_pairs.get(q).is_some_and(|s| s.alive)).collect())
            .unwrap_or_default();
        if live.is_empty() {
            let reason = "no live queue pair left on the connection (reconnect through the control plane)";
            for p in pieces {
                self.fail_piece(st, ticket_id, p, reason);
            }
            return;
        }
        let start = st.connections.get(&conn_id).map_or(0, |c| c.next_queue_pair);
        for (n, group) in pieces.chunks(self.config.chain_len).enumerate() {
            let qp = live[(start + n) % live.len()];
            let chain_id = st.next_id;
            st.next_id += 1;
            st.chains.insert(chain_id, Chain { ticket: ticket_id, qp, pieces: group.to_vec(), posted: 0 });
            if let Some(q) = st.queue_pairs.get_mut(&qp) {
                q.waiting.push_back(chain_id);
            }
        }
        if let Some(c) = st.connections.get_mut(&conn_id) {
            c.next_queue_pair = start.wrapping_add(pieces.len().div_ceil(self.config.chain_len));
        }
    }

    fn finish_piece(st: &mut ClientState, ticket_id: u64, piece: usize, to: PieceState) {
        let Some(t) = st.tickets.get_mut(&ticket_id) else { return };
        if t.states.get(piece) != Some(&PieceState::InFlight) {
            return;
        }
        t.states[piece] = to;
        t.unfinished -= 1;
        if t.unfinished == 0 {
            let buffer = t.buffer;
            if let Some(b) = st.buffers.get_mut(&buffer) {
                b.tickets_in_flight = b.tickets_in_flight.saturating_sub(1);
            }
        }
    }

    fn fail_piece(&self, st: &mut ClientState, ticket_id: u64, piece: usize, reason: &str) {
        if let Some(t) = st.tickets.get_mut(&ticket_id) {
            if let Some(p) = t.pieces.get(piece) {
                if !t.failed_ops.contains(&p.op) {
                    t.failed_ops.push(p.op);
                }
                t.first_reason.get_or_insert_with(|| reason.to_string());
            }
        }
        Self::finish_piece(st, ticket_id, piece, PieceState::Failed);
    }

    /// Takes a queue pair out of service (module docs): chains waiting on
    /// it move to the live queue pairs at once; with requests in flight it
    /// is flushed and drains (destroyed when its marker completes), else
    /// it is destroyed now.
    pub(super) fn retire_queue_pair(&self, st: &mut ClientState, qp_number: u32) {
        let Some(q) = st.queue_pairs.get_mut(&qp_number) else { return };
        if q.draining.is_some() {
            return;
        }
        q.alive = false;
        let id = q.id;
        let waiting: Vec<u64> = q.waiting.drain(..).collect();
        let idle = q.in_flight.is_empty() && q.outstanding == 0;
        if idle || !self.start_drain(st, qp_number, id) {
            self.destroy_now(st, qp_number);
        }
        for chain_id in waiting {
            if let Some(chain) = st.chains.remove(&chain_id) {
                self.requeue(st, chain.ticket, chain.pieces);
            }
        }
    }

    /// Flushes `qp` and posts its drain marker; false when the device
    /// refused either (the queue pair is then destroyed undrained: nothing
    /// better is left to do with it).
    fn start_drain(&self, st: &mut ClientState, qp_number: u32, id: QueuePairId) -> bool {
        if self.verbs.flush_queue_pair(id).is_err() {
            return false;
        }
        let marker = st.next_id;
        st.next_id += 1;
        // Never executed (the queue pair is in the error state): it only
        // completes, flushed, after every request posted before it.
        let request = ReadRequest {
            wr_id: marker << INDEX_BITS,
            local_addr: 0,
            lkey: 0,
            remote_addr: 0,
            rkey: 0,
            len: 0,
            signaled: true,
        };
        if self.verbs.post_reads(id, &[request]).is_err() {
            return false;
        }
        st.markers.insert(marker, qp_number);
        if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
            q.draining = Some(marker);
        }
        true
    }

    /// Destroys a queue pair that has nothing in flight (or could not be
    /// drained), releases its room and moves its unfinished pieces on.
    fn destroy_now(&self, st: &mut ClientState, qp_number: u32) {
        let Some(q) = st.queue_pairs.remove(&qp_number) else { return };
        st.total_outstanding = st.total_outstanding.saturating_sub(q.outstanding);
        if let Some(marker) = q.draining {
            st.markers.remove(&marker);
        }
        // Destroying may fail on a broken device; the queue pair is out of
        // service either way.
        let _ = self.verbs.destroy_queue_pair(q.id);
        for chain_id in q.in_flight.into_iter().chain(q.waiting) {
            if let Some(chain) = st.chains.remove(&chain_id) {
                self.requeue(st, chain.ticket, chain.pieces);
            }
        }
    }

    fn on_completion(&self, st: &mut ClientState, wc: WorkCompletion) {
        let chain_id = wc.wr_id >> INDEX_BITS;
        let index = (wc.wr_id & ((1 << INDEX_BITS) - 1)) as usize;
        if let Some(qp_number) = st.markers.remove(&chain_id) {
            // A retired queue pair's marker: every completion of it was
            // polled (they come in order), so its room is free and nothing
            // more lands from it.
            self.destroy_now(st, qp_number);
            return;
        }
        let Some(qp_number) = st.chains.get(&chain_id).map(|c| c.qp) else { return };
        let Some(q) = st.queue_pairs.get(&qp_number) else { return };
        if !q.in_flight.contains(&chain_id) {
            return;
        }
        // A draining queue pair's successes finish their chains as usual;
        // its errors and flushes say nothing new: what did not land is
        // moved on when the drain ends.
        if q.draining.is_some() && wc.status != CompletionStatus::Success {
            return;
        }
        // Chains posted before this one on the queue pair have completed.
        loop {
            let Some(q) = st.queue_pairs.get_mut(&qp_number) else { return };
            let Some(&front) = q.in_flight.front() else { return };
            if front == chain_id && wc.status != CompletionStatus::Success {
                break;
            }
            q.in_flight.pop_front();
            if let Some(chain) = st.chains.remove(&front) {
                if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                    q.outstanding = q.outstanding.saturating_sub(chain.posted as u32);
                }
                st.total_outstanding = st.total_outstanding.saturating_sub(chain.posted as u32);
                for &p in chain.pieces.iter().take(chain.posted) {
                    Self::finish_piece(st, chain.ticket, p, PieceState::Done);
                }
            }
            if front == chain_id {
                return;
            }
        }
        // An error: requests before `index` landed, the one at `index`
        // failed, and the queue pair is in the error state.
        let Some(chain) = st.chains.get(&chain_id) else { return };
        let (ticket, pieces) = (chain.ticket, chain.pieces.clone());
        let index = index.min(pieces.len().saturating_sub(1));
        let Some(&failing) = pieces.get(index) else {
            self.retire_queue_pair(st, qp_number);
            return;
        };
        for &p in &pieces[..index] {
            Self::finish_piece(st, ticket, p, PieceState::Done);
        }
        if let Some(chain) = st.chains.get_mut(&chain_id) {
            // Only the unfinished rest goes back out with the queue pair's
            // other chains when it is retired.
            chain.pieces = pieces[index..].to_vec();
            chain.posted = chain.posted.saturating_sub(index);
        }
        let status = wc.status;
        // A flush is not the piece's fault: it goes out again uncounted.
        let counted = status != CompletionStatus::Flushed;
        let attempts = st.tickets.get_mut(&ticket).and_then(|t| {
            let a = t.attempts.get_mut(failing)?;
            *a += u32::from(counted);
            Some(*a)
        });
        let retry = status == CompletionStatus::Flushed
            || (status.is_retryable() && attempts.is_some_and(|a| a < self.config.max_attempts));
        if !retry {
            let reason = format!("{status:?} on queue pair {qp_number:#x}");
            self.fail_piece(st, ticket, failing, &reason);
            if let Some(chain) = st.chains.get_mut(&chain_id) {
                chain.pieces.remove(0);
            }
        }
        self.retire_queue_pair(st, qp_number);
    }

    /// Posts waiting chains where queue pairs and the completion queue
    /// have room.
    pub(super) fn pump(&self, st: &mut ClientState) {
        let qp_numbers: Vec<u32> = st.queue_pairs.iter().filter(|(_, q)| q.alive).map(|(n, _)| *n).collect();
        for qp_number in qp_numbers {
            while let Some(q) = st.queue_pairs.get(&qp_number) {
                if !q.alive {
                    break;
                }
                let Some(&chain_id) = q.waiting.front() else { break };
                let Some(chain) = st.chains.get(&chain_id) else {
                    if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                        q.waiting.pop_front();
                    }
                    continue;
                };
                let n = chain.pieces.len() as u32;
                if q.outstanding + n > self.config.send_queue_depth
                    || !st.room_for(n, self.config.completion_queue_entries)
                {
                    break;
                }
                let Some(requests) = self.requests(st, chain_id) else {
                    // Its connection or buffer is gone (neither should be
                    // while reads are in flight): fail the pieces rather
                    // than leave the ticket waiting for nothing.
                    if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                        q.waiting.pop_front();
                    }
                    if let Some(chain) = st.chains.remove(&chain_id) {
                        for p in chain.pieces {
                            self.fail_piece(st, chain.ticket, p, "connection or buffer released under the read");
                        }
                    }
                    continue;
                };
                let qp_id = q.id;
                let posted = match self.verbs.post_reads(qp_id, &requests) {
                    Ok(()) => requests.len(),
                    Err(e) if e.posted == 0 => {
                        self.retire_queue_pair(st, qp_number);
                        break;
                    }
                    Err(e) => e.posted.min(requests.len()),
                };
                let Some(q) = st.queue_pairs.get_mut(&qp_number) else { break };
                q.waiting.pop_front();
                q.in_flight.push_back(chain_id);
                q.outstanding += posted as u32;
                st.total_outstanding += posted as u32;
                if posted < requests.len() {
                    // A partial post: the prefix is in flight unsignalled
                    // and completes with the next signalled chain; the rest
                    // (ending with the signalled request) is tried again
                    // first on this queue pair.
                    let Some(chain) = st.chains.get_mut(&chain_id) else { break };
                    let rest = chain.pieces.split_off(posted);
                    chain.posted = posted;
                    let ticket = chain.ticket;
                    let rest_id = st.next_id;
                    st.next_id += 1;
                    st.chains.insert(rest_id, Chain { ticket, qp: qp_number, pieces: rest, posted: 0 });
                    if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                        q.waiting.push_front(rest_id);
                    }
                    break;
                }
                if let Some(chain) = st.chains.get_mut(&chain_id) {
                    chain.posted = posted;
                }
            }
        }
    }

    fn requests(&self, st: &ClientState, chain_id: u64) -> Option<Vec<ReadRequest>> {
        let chain = st.chains.get(&chain_id)?;
        let ticket = st.tickets.get(&chain.ticket)?;
        let conn = st.connections.get(&ticket.connection)?;
        let buffer = st.buffers.get(&ticket.buffer)?;
        let last = chain.pieces.len().checked_sub(1)?;
        chain
            .pieces
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let piece = ticket.pieces.get(p)?;
                Some(ReadRequest {
                    wr_id: (chain_id << INDEX_BITS) | i as u64,
                    local_addr: buffer.addr.checked_add(piece.local_offset)?,
                    lkey: buffer.keys.lkey,
                    remote_addr: conn.remote_addr.checked_add(piece.remote_offset)?,
                    rkey: conn.rkey,
                    len: piece.len,
                    signaled: i == last,
                })
            })
            .collect()
    }

    /// Polls the completion queue once and posts what now fits.
    pub(super) fn progress(&self, st: &mut ClientState) -> CoreResult<()> {
        let mut completions = std::mem::take(&mut st.completions);
        completions.clear();
        let polled = self.verbs.poll_completions(&mut completions, 256);
        for wc in completions.drain(..) {
            self.on_completion(st, wc);
        }
        st.completions = completions;
        polled?;
        self.pump(st);
        Ok(())
    }

    /// The outcome of a finished ticket (retiring it), or `None`.
    pub(super) fn take_outcome(st: &mut ClientState, ticket: &Ticket) -> CoreResult<Option<()>> {
        let t = st
            .tickets
            .get(&ticket.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("ticket {} is not in flight", ticket.id())))?;
        if t.unfinished > 0 {
            return Ok(None);
        }
        let Some(t) = st.tickets.remove(&ticket.id()) else { return Ok(None) };
        if t.failed_ops.is_empty() {
            return Ok(Some(()));
        }
        let mut failed = t.failed_ops;
        failed.sort_unstable();
        Err(gear_core::Error::RemoteRead {
            shard: t.shard,
            failed,
            total_ops: t.total_ops,
            reason: t.first_reason.unwrap_or_default(),
        })
    }
}

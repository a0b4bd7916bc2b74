//! The reading side: [`TcpTransport`], `gear_core::Transport` over TCP.
//!
//! `post_reads` checks the batch ([`check_read_ops`]), starts one streamed
//! `Read` call on the transport's own tokio runtime and returns a ticket at
//! once. The call's task writes each chunk into the registered local buffer
//! as it arrives, under the ticket's lock, so once a ticket has finished
//! (landed, failed, or ended by [`disconnect`](gear_core::Transport::disconnect))
//! nothing more is written into its buffer. Every call runs under
//! [`TcpConfig::call_timeout`]; a stream that ends early, sends a chunk out
//! of place or too many bytes fails the ticket with
//! [`gear_core::Error::RemoteRead`] naming the ops whose bytes did not all
//! land.

use std::collections::{HashMap, HashSet};
use std::ptr::NonNull;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gear_core::{
    check_read_ops, LocalBuffer, MemoryRegion, PeerEndpoint, PendingConnection, ReadOp, RemoteAccess, RemoteHandle,
    RemoteRegion, TcpEndpoint, Ticket, Transport, TransportKind,
};
use parking_lot::{Condvar, Mutex};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

use crate::proto::region_reader_client::RegionReaderClient;
use crate::proto::{ReadRange, ReadRequest};

type CoreResult<T> = gear_core::Result<T>;

/// Settings of a [`TcpTransport`].
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Deadline of opening a connection.
    pub connect_timeout: Duration,
    /// Deadline of one posted batch, from post to its last byte; a batch
    /// still streaming then fails.
    pub call_timeout: Duration,
    /// Metadata sent with every call (e.g. `authorization: Bearer ...`).
    pub headers: Vec<(String, String)>,
    /// Largest chunk accepted from a server (servers send at most 16 MiB).
    pub max_chunk_bytes: usize,
    /// Threads of the transport's runtime.
    pub worker_threads: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(10),
            headers: Vec::new(),
            max_chunk_bytes: 16 << 20,
            worker_threads: 2,
        }
    }
}

/// Adds the configured metadata to every call.
#[derive(Clone, Debug)]
struct Headers(Arc<Vec<(AsciiMetadataKey, AsciiMetadataValue)>>);

impl Interceptor for Headers {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        for (k, v) in self.0.iter() {
            request.metadata_mut().insert(k.clone(), v.clone());
        }
        Ok(request)
    }
}

type Client = RegionReaderClient<InterceptedService<Channel, Headers>>;

/// Where a ticket's bytes land: the registered region, kept alive.
#[derive(Clone)]
struct Destination {
    _region: Arc<dyn MemoryRegion>,
    base: NonNull<u8>,
}

// SAFETY: `base` points into `_region`, which is `Send + Sync`; writes
// through it happen only under a ticket's lock (see `stream_batch`).
unsafe impl Send for Destination {}
// SAFETY: as for `Send`; a shared `Destination` only hands out the pointer.
unsafe impl Sync for Destination {}

struct Buffer {
    dest: Destination,
    len: u64,
    busy: usize,
}

struct Connection {
    shard: u32,
    len: u64,
    region_id: u64,
    client: Client,
    tickets: HashSet<u64>,
}

enum Outcome {
    Running,
    Done(CoreResult<()>),
    Retired,
}

struct TicketRecord {
    connection: u64,
    total_ops: u64,
    buffer: u64,
    outcome: Mutex<Outcome>,
    finished: Condvar,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl TicketRecord {
    /// Records `result` unless the ticket already finished.
    fn finish(&self, result: CoreResult<()>) {
        let mut o = self.outcome.lock();
        if matches!(*o, Outcome::Running) {
            *o = Outcome::Done(result);
            self.finished.notify_all();
        }
    }
}

#[derive(Default)]
struct State {
    next_id: u64,
    buffers: HashMap<u64, Buffer>,
    pending: HashMap<u64, u32>,
    connections: HashMap<u64, Connection>,
    tickets: HashMap<u64, Arc<TicketRecord>>,
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// `gear_core::Transport` over TCP (see the module docs). Owns a small
/// tokio runtime, so callers need no async code.
pub struct TcpTransport {
    runtime: tokio::runtime::Runtime,
    config: TcpConfig,
    headers: Headers,
    state: Mutex<State>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport").field("call_timeout", &self.config.call_timeout).finish()
    }
}

impl TcpTransport {
    /// A transport with its own runtime. Refuses header names or values
    /// that cannot be sent as ASCII metadata.
    pub fn new(config: TcpConfig) -> crate::Result<Self> {
        let mut headers = Vec::with_capacity(config.headers.len());
        for (k, v) in &config.headers {
            let key = AsciiMetadataKey::from_str(k)
                .map_err(|_| crate::Error::Config(format!("header name `{k}` is not valid metadata")))?;
            let value = AsciiMetadataValue::try_from(v.as_str())
                .map_err(|_| crate::Error::Config(format!("header `{k}` has a value that is not printable ASCII")))?;
            headers.push((key, value));
        }
        if config.worker_threads == 0 {
            return Err(crate::Error::Config("a transport needs at least one worker thread".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads)
            .thread_name("gear-tcp")
            .enable_all()
            .build()?;
        Ok(TcpTransport { runtime, config, headers: Headers(Arc::new(headers)), state: Mutex::default() })
    }

    fn retire(&self, ticket: &Ticket, record: &TicketRecord) {
        let mut st = self.state.lock();
        st.tickets.remove(&ticket.id());
        if let Some(b) = st.buffers.get_mut(&record.buffer) {
            b.busy = b.busy.saturating_sub(1);
        }
        if let Some(c) = st.connections.get_mut(&record.connection) {
            c.tickets.remove(&ticket.id());
        }
    }

    fn record(&self, ticket: &Ticket) -> CoreResult<Arc<TicketRecord>> {
        self.state
            .lock()
            .tickets
            .get(&ticket.id())
            .cloned()
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("ticket {} is not in flight", ticket.id())))
    }

    /// Takes a finished outcome, retiring the ticket.
    fn take(&self, ticket: &Ticket, record: &TicketRecord, o: &mut Outcome) -> Option<CoreResult<()>> {
        match std::mem::replace(o, Outcome::Retired) {
            Outcome::Done(result) => {
                self.retire(ticket, record);
                Some(result)
            }
            Outcome::Running => {
                *o = Outcome::Running;
                None
            }
            Outcome::Retired => {
                Some(Err(gear_core::Error::InvalidHandle(format!("ticket {} already finished", ticket.id()))))
            }
        }
    }
}

/// The ops of a batch that did not fully land after `received` bytes of
/// their concatenation.
fn unlanded(ops: &[ReadOp], received: u64) -> Vec<u32> {
    let mut end = 0u64;
    let mut failed = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        end = end.saturating_add(op.len);
        if op.len > 0 && end > received {
            failed.push(i as u32);
        }
    }
    failed
}

/// Streams one batch into `dest`; returns the bytes landed and, on failure,
/// why.
async fn stream_batch(
    mut client: Client,
    request: ReadRequest,
    ops: &[ReadOp],
    total: u64,
    dest: &Destination,
    record: &TicketRecord,
) -> (u64, Result<(), String>) {
    let mut received = 0u64;
    let mut stream = match client.read(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return (0, Err(format!("{}: {}", s.code(), s.message()))),
    };
    // Where the next byte goes: op index and bytes of it already landed.
    let (mut op, mut into) = (0usize, 0u64);
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) if received == total => return (received, Ok(())),
            Ok(None) => return (received, Err(format!("the stream ended after {received} of {total} bytes"))),
            Err(s) => return (received, Err(format!("{}: {}", s.code(), s.message()))),
        };
        let n = chunk.data.len() as u64;
        if chunk.position != received || n > total - received {
            return (
                received,
                Err(format!(
                    "the server sent {n} bytes at position {} after {received} of {total} bytes",
                    chunk.position
                )),
            );
        }
        let o = record.outcome.lock();
        if !matches!(*o, Outcome::Running) {
            // Finished by `disconnect`: no byte may land any more.
            return (received, Err("disconnected".into()));
        }
        let mut at = 0usize;
        while at < chunk.data.len() {
            let Some(cur) = ops.get(op) else { break };
            let take = ((cur.len - into) as usize).min(chunk.data.len() - at);
            // SAFETY: `check_read_ops` put `local_offset + len` of every op
            // inside the registered buffer of `dest.base`, which `dest`
            // keeps alive; `into + take <= cur.len`, so the write stays in
            // the op's local range; `chunk.data` is a separate allocation.
            // Writes happen only while the ticket is running, under its
            // lock, so none lands after the ticket finished.
            unsafe {
                gear_core::copy::copy_bytes(
                    chunk.data.as_ptr().add(at),
                    dest.base.as_ptr().add((cur.local_offset + into) as usize),
                    take,
                );
            }
            at += take;
            into += take as u64;
            if into == cur.len {
                op += 1;
                into = 0;
            }
        }
        drop(o);
        received += n;
        // Skip empty ops so `ops[op]` always has bytes left.
        while ops.get(op).is_some_and(|c| c.len == 0) {
            op += 1;
        }
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn register_local(&self, region: Arc<dyn MemoryRegion>) -> CoreResult<LocalBuffer> {
        let (base, _) = region.host_span("tcp reads land in host-addressable memory")?;
        let len = region.len();
        let mut st = self.state.lock();
        let id = st.id();
        st.buffers.insert(id, Buffer { dest: Destination { _region: region, base }, len, busy: 0 });
        Ok(LocalBuffer::new(id, len))
    }

    fn release_local(&self, buffer: &LocalBuffer) -> CoreResult<()> {
        let mut st = self.state.lock();
        let b = st.buffers.get(&buffer.id()).ok_or_else(|| {
            gear_core::Error::InvalidHandle(format!("local buffer {} is not registered", buffer.id()))
        })?;
        if b.busy > 0 {
            return Err(gear_core::Error::Busy(format!(
                "local buffer {} has {} tickets in flight",
                buffer.id(),
                b.busy
            )));
        }
        st.buffers.remove(&buffer.id());
        Ok(())
    }

    fn prepare_connection(&self, shard: u32) -> CoreResult<PendingConnection> {
        let mut st = self.state.lock();
        let id = st.id();
        st.pending.insert(id, shard);
        Ok(PendingConnection { id, endpoint: PeerEndpoint::Tcp(TcpEndpoint { address: String::new() }) })
    }

    fn connect(&self, pending: PendingConnection, remote: &RemoteRegion) -> CoreResult<RemoteHandle> {
        // Taken out first: `connect` consumes the pending connection
        // whatever its outcome.
        let shard = self.state.lock().pending.remove(&pending.id).ok_or_else(|| {
            gear_core::Error::InvalidHandle(format!("connection {} was not prepared here", pending.id))
        })?;
        remote.validate()?;
        let RemoteAccess::Tcp { peer, region_id } = &remote.access else {
            return Err(gear_core::Error::Descriptor(format!(
                "a tcp transport got a {} descriptor",
                remote.kind().name()
            )));
        };
        if shard != remote.shard {
            return Err(gear_core::Error::Descriptor(format!(
                "connection prepared for shard {shard} got a descriptor of shard {}",
                remote.shard
            )));
        }
        let channel = {
            let _guard = self.runtime.enter();
            Endpoint::from_shared(format!("http://{}", peer.address))
                .map_err(|e| gear_core::Error::Descriptor(format!("tcp address `{}`: {e}", peer.address)))?
                .connect_timeout(self.config.connect_timeout)
                .timeout(self.config.call_timeout)
                .tcp_nodelay(true)
                .initial_stream_window_size(Some(8 << 20))
                .initial_connection_window_size(Some(32 << 20))
                .connect_lazy()
        };
        let client = RegionReaderClient::with_interceptor(channel, self.headers.clone())
            .max_decoding_message_size(self.config.max_chunk_bytes + 1024);
        let mut st = self.state.lock();
        let id = st.id();
        st.connections
            .insert(id, Connection { shard, len: remote.len, region_id: *region_id, client, tickets: HashSet::new() });
        Ok(RemoteHandle::new(id, shard, remote.len))
    }

    fn abort(&self, pending: PendingConnection) -> CoreResult<()> {
        self.state
            .lock()
            .pending
            .remove(&pending.id)
            .map(drop)
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("connection {} was not prepared here", pending.id)))
    }

    fn disconnect(&self, remote: &RemoteHandle) -> CoreResult<()> {
        let conn = self
            .state
            .lock()
            .connections
            .remove(&remote.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("connection {} is not open", remote.id())))?;
        let records: Vec<Arc<TicketRecord>> = {
            let st = self.state.lock();
            conn.tickets.iter().filter_map(|t| st.tickets.get(t).cloned()).collect()
        };
        for r in records {
            // Under the ticket's lock: after this no byte of it lands.
            r.finish(Err(gear_core::Error::RemoteRead {
                shard: conn.shard,
                failed: (0..r.total_ops as u32).collect(),
                total_ops: r.total_ops,
                reason: "disconnected while the reads were in flight".into(),
            }));
            if let Some(task) = r.task.lock().take() {
                task.abort();
            }
        }
        Ok(())
    }

    fn post_reads(&self, remote: &RemoteHandle, local: &LocalBuffer, ops: &[ReadOp]) -> CoreResult<Ticket> {
        let mut st = self.state.lock();
        let conn = st
            .connections
            .get(&remote.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("connection {} is not open", remote.id())))?;
        let buffer = st
            .buffers
            .get(&local.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("local buffer {} is not registered", local.id())))?;
        check_read_ops(conn.len, buffer.len, ops)?;
        let total = ops.iter().map(|o| o.len).sum::<u64>();
        let (shard, client, dest) = (conn.shard, conn.client.clone(), buffer.dest.clone());
        let request = ReadRequest {
            region_id: conn.region_id,
            ranges: ops
                .iter()
                .filter(|o| o.len > 0)
                .map(|o| ReadRange { offset: o.remote_offset, len: o.len })
                .collect(),
        };
        let id = st.id();
        let record = Arc::new(TicketRecord {
            connection: remote.id(),
            total_ops: ops.len() as u64,
            buffer: local.id(),
            outcome: Mutex::new(Outcome::Running),
            finished: Condvar::new(),
            task: Mutex::new(None),
        });
        st.tickets.insert(id, record.clone());
        if let Some(b) = st.buffers.get_mut(&local.id()) {
            b.busy += 1;
        }
        if let Some(c) = st.connections.get_mut(&remote.id()) {
            c.tickets.insert(id);
        }
        drop(st);
        if total == 0 {
            record.finish(Ok(()));
            return Ok(Ticket::new(id, shard));
        }
        let ops = ops.to_vec();
        let call_timeout = self.config.call_timeout;
        let task_record = record.clone();
        let task = self.runtime.spawn(async move {
            let run = stream_batch(client, request, &ops, total, &dest, &task_record);
            let (received, result) = match tokio::time::timeout(call_timeout, run).await {
                Ok(outcome) => outcome,
                Err(_) => (0, Err(format!("the read did not finish within {call_timeout:?}"))),
            };
            task_record.finish(result.map_err(|reason| gear_core::Error::RemoteRead {
                shard,
                failed: unlanded(&ops, received),
                total_ops: ops.len() as u64,
                reason,
            }));
        });
        *record.task.lock() = Some(task);
        Ok(Ticket::new(id, shard))
    }

    fn poll(&self, ticket: &Ticket) -> CoreResult<bool> {
        let record = self.record(ticket)?;
        let mut o = record.outcome.lock();
        match self.take(ticket, &record, &mut o) {
            Some(result) => result.map(|()| true),
            None => Ok(false),
        }
    }

    fn wait(&self, ticket: &Ticket, deadline: Instant) -> CoreResult<()> {
        let record = self.record(ticket)?;
        let mut o = record.outcome.lock();
        loop {
            if let Some(result) = self.take(ticket, &record, &mut o) {
                return result;
            }
            if record.finished.wait_until(&mut o, deadline).timed_out() && matches!(*o, Outcome::Running) {
                return Err(gear_core::Error::Timeout(format!(
                    "tcp reads of ticket {} from shard {} are still in flight",
                    ticket.id(),
                    ticket.shard()
                )));
            }
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // Tasks hold their destination's `Arc`; end them before the runtime.
        for r in self.state.get_mut().tickets.values() {
            r.finish(Err(gear_core::Error::Transport("tcp transport dropped".into())));
        }
    }
}

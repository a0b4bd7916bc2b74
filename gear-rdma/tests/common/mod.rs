//! Shared setup of the transport tests: host buffers, shards on an
//! in-process fabric, and a connected client.

#![allow(dead_code)]

use std::ptr::NonNull;
use std::sync::Arc;

use gear_core::{ExposedRegion, MemoryKind, MemoryRegion, RemoteHandle, Transport, TransportServer};
use gear_rdma::{InProcessFabric, InProcessVerbs, RdmaConfig, RdmaServer, RdmaTransport};

/// A heap buffer used only through raw pointers, as `MemoryRegion` asks.
pub struct TestBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain heap memory owned by this value; every access
// goes through raw pointers, as `MemoryRegion` requires of its users.
unsafe impl Send for TestBuffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for TestBuffer {}

impl TestBuffer {
    /// `len` bytes, each `fill(i)`.
    pub fn new(len: usize, fill: impl Fn(usize) -> u8) -> Arc<Self> {
        let bytes: Box<[u8]> = (0..len.max(1)).map(fill).collect();
        let ptr = NonNull::new(Box::into_raw(bytes).cast::<u8>()).expect("box pointers are not null");
        Arc::new(TestBuffer { ptr, len })
    }

    /// A copy of the current bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        // SAFETY: `ptr` holds `len` initialised bytes for the life of
        // `self`; reads in flight are waited for before tests look.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), out.as_mut_ptr(), self.len) };
        out
    }
}

impl Drop for TestBuffer {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len.max(1));
        // SAFETY: `ptr` came from `Box::into_raw` of a slice of this length.
        drop(unsafe { Box::from_raw(slice) });
    }
}

// SAFETY: `ptr` points to `len` readable and writable bytes for as long as
// the value lives; byte alignment is all it promises.
unsafe impl MemoryRegion for TestBuffer {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn alignment(&self) -> u64 {
        1
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.ptr)
    }
}

/// The byte at `i` of shard `shard`'s region.
pub fn pattern(shard: u32, i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8) ^ (shard as usize * 101)) as u8
}

/// A GID for node `n` (fe80::n, as a RoCE link-local GID would look).
pub fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = n;
    g
}

/// One shard: a server on its own node, exposing a patterned region.
pub struct Shard {
    pub server: RdmaServer<InProcessVerbs>,
    pub region: Arc<TestBuffer>,
    pub exposed: ExposedRegion,
}

impl Shard {
    pub fn new(fabric: &InProcessFabric, shard: u32, len: usize) -> Shard {
        let server = RdmaServer::new(fabric.add_node(gid(100 + shard as u8)).unwrap()).unwrap();
        let region = TestBuffer::new(len, |i| pattern(shard, i));
        let exposed = server.expose(shard, 7, region.clone()).unwrap();
        Shard { server, region, exposed }
    }
}

/// A client node with a transport.
pub fn client(fabric: &InProcessFabric, config: RdmaConfig) -> RdmaTransport<InProcessVerbs> {
    RdmaTransport::new(fabric.add_node(gid(1)).unwrap(), config).unwrap()
}

/// Connects `client` to `shard` the way the control plane will: the
/// client's endpoint goes to the server, the server's descriptor comes back.
pub fn connect(client: &RdmaTransport<InProcessVerbs>, shard: &Shard) -> RemoteHandle {
    let pending = client.prepare_connection(shard.exposed.shard()).unwrap();
    let remote = shard.server.accept(&shard.exposed, &pending.endpoint).unwrap();
    client.connect(pending, &remote).unwrap()
}

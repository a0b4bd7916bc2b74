//! Shared setup of the transport tests: host buffers, shards on an
//! in-process fabric, and a connected client.

#![allow(dead_code)]

use std::sync::Arc;

use gear_core::{ExposedRegion, HeapRegion, ReadOp, RemoteHandle, Transport, TransportServer};
use gear_rdma::{InProcessFabric, InProcessVerbs, RdmaConfig, RdmaServer, RdmaTransport};

/// A test region of `len` bytes, byte `i` being `fill(i)` (gear-core's
/// heap region).
pub fn buffer(len: usize, fill: impl Fn(usize) -> u8) -> Arc<HeapRegion> {
    Arc::new(HeapRegion::from_fn(len, fill))
}

/// A copy of a region's current bytes; callers have waited for every read
/// into it.
pub fn snapshot(region: &HeapRegion) -> Vec<u8> {
    // SAFETY: the tests call this only once the reads into `region` were
    // waited for (or ended), so nothing writes it now.
    unsafe { region.bytes() }.to_vec()
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
    pub region: Arc<HeapRegion>,
    pub exposed: ExposedRegion,
}

impl Shard {
    pub fn new(fabric: &InProcessFabric, shard: u32, len: usize) -> Shard {
        let server = RdmaServer::new(fabric.add_node(gid(100 + shard as u8)).unwrap()).unwrap();
        let region = buffer(len, |i| pattern(shard, i));
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

/// Checks that every op not in `failed` holds the bytes of shard `shard`'s
/// region it read; callers have waited for the reads.
pub fn check_landed(shard: u32, local: &HeapRegion, ops: &[ReadOp], failed: &[u32]) {
    let bytes = snapshot(local);
    for (i, op) in ops.iter().enumerate() {
        if failed.contains(&(i as u32)) {
            continue;
        }
        for k in 0..op.len as usize {
            let want = pattern(shard, op.remote_offset as usize + k);
            assert_eq!(bytes[op.local_offset as usize + k], want, "op {i} byte {k}");
        }
    }
}

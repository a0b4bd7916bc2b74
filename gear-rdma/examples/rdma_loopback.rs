//! Loopback test of the RDMA transport over a real device (feature `rdma`):
//! a server and a client opened on the same port, connected by GID over
//! several queue pairs, reading a registered region with one-sided READs;
//! every byte is checked, then a throughput figure is printed. Run it with
//! `cargo xtask rdma-test` (see the README).
//!
//! Flags: `--device NAME` (default: the first), `--port N` (1),
//! `--gid-index N` (default: the port's RoCE v2 entry of an IPv4, else
//! IPv6, address, else 0), `--traffic-class N` (0), `--service-level N`
//! (0), `--mib N`
//! region size (256), `--read-kib N` size of each READ (64), `--batch N` ops
//! per ticket (256), `--seconds N` throughput run (3).
//! Without a device it prints why and exits 0, or 1 when
//! `GEAR_REQUIRE_RDMA=1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gear_core::{HeapRegion, ReadOp, Transport, TransportServer};
use gear_rdma::{RdmaConfig, RdmaServer, RdmaServerConfig, RdmaTransport, SidewayVerbs};

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 12)) as u8
}

fn arg(args: &[String], flag: &str, default: u64) -> Result<u64, String> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{flag} takes a whole number")),
        None => Ok(default),
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("rdma-test: FAILED: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = args.iter().position(|a| a == "--device").and_then(|i| args.get(i + 1)).map(String::as_str);
    let port = u8::try_from(arg(&args, "--port", 1)?).map_err(|e| e.to_string())?;
    let gid_index = match args.iter().any(|a| a == "--gid-index") {
        true => Some(u8::try_from(arg(&args, "--gid-index", 0)?).map_err(|e| e.to_string())?),
        false => None,
    };
    let traffic_class = u8::try_from(arg(&args, "--traffic-class", 0)?).map_err(|e| e.to_string())?;
    let service_level = u8::try_from(arg(&args, "--service-level", 0)?).map_err(|e| e.to_string())?;
    let region_len = (arg(&args, "--mib", 256)? as usize) << 20;
    let read_len = (arg(&args, "--read-kib", 64)? as usize) << 10;
    let batch = arg(&args, "--batch", 256)? as usize;
    let seconds = arg(&args, "--seconds", 3)?;
    if read_len == 0 || batch == 0 || read_len * batch > region_len {
        return Err("need --read-kib x --batch <= --mib and both above 0".into());
    }

    let server_verbs = match SidewayVerbs::open(device, port, gid_index) {
        Ok(v) => v,
        Err(e) if std::env::var("GEAR_REQUIRE_RDMA").as_deref() != Ok("1") => {
            println!("rdma-test: skipped: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.to_string()),
    };
    let client_verbs = SidewayVerbs::open(device, port, gid_index).map_err(|e| e.to_string())?;
    println!(
        "rdma-test: gid index {} ({})",
        client_verbs.gid_index(),
        if gid_index.is_some() { "given" } else { "chosen from the gid table" }
    );
    let server_config = RdmaServerConfig { traffic_class, service_level, ..RdmaServerConfig::default() };
    let server = RdmaServer::with_config(server_verbs, server_config).map_err(|e| e.to_string())?;
    let config = RdmaConfig { traffic_class, service_level, ..RdmaConfig::default() };
    let transport = RdmaTransport::new(client_verbs, config).map_err(|e| e.to_string())?;

    let shard = Arc::new(HeapRegion::from_fn(region_len, pattern));
    let exposed = server.expose(0, 1, shard.clone()).map_err(|e| e.to_string())?;
    let pending = transport.prepare_connection(0).map_err(|e| e.to_string())?;
    let remote = server.accept(&exposed, &pending.endpoint).map_err(|e| e.to_string())?;
    println!("rdma-test: connected by gid over {} queue pairs: {:?}", RdmaConfig::default().queue_pairs, remote.access);
    let handle = transport.connect(pending, &remote).map_err(|e| e.to_string())?;
    let local = Arc::new(HeapRegion::zeroed(read_len * batch));
    let buffer = transport.register_local(local.clone()).map_err(|e| e.to_string())?;

    // Correctness: a batch of reads at scattered offsets, every byte checked.
    let slots = region_len / read_len;
    let ops: Vec<ReadOp> = (0..batch)
        .map(|i| ReadOp {
            remote_offset: (((i * 7919) % slots) * read_len + (i % 64)).min(region_len - read_len) as u64,
            local_offset: (i * read_len) as u64,
            len: read_len as u64,
        })
        .collect();
    let ticket = transport.post_reads(&handle, &buffer, &ops).map_err(|e| e.to_string())?;
    transport.wait(&ticket, Instant::now() + Duration::from_secs(30)).map_err(|e| e.to_string())?;
    // SAFETY: the ticket finished, so nothing writes the buffer now.
    let landed = unsafe { local.bytes() };
    for (i, op) in ops.iter().enumerate() {
        for k in 0..read_len {
            let (got, want) = (landed[op.local_offset as usize + k], pattern(op.remote_offset as usize + k));
            if got != want {
                return Err(format!("op {i} byte {k}: read {got:#04x}, region holds {want:#04x}"));
            }
        }
    }
    println!("rdma-test: {batch} reads of {read_len} bytes landed byte-exact");

    // Throughput: batches back to back for `seconds`.
    let started = Instant::now();
    let mut bytes = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let ticket = transport.post_reads(&handle, &buffer, &ops).map_err(|e| e.to_string())?;
        transport.wait(&ticket, Instant::now() + Duration::from_secs(30)).map_err(|e| e.to_string())?;
        bytes += (read_len * batch) as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "rdma-test: loopback read throughput {:.2} GB/s ({} MiB in {secs:.2} s, reads of {read_len} B, {batch} per ticket)",
        bytes as f64 / secs / 1e9,
        bytes >> 20
    );
    transport.release_local(&buffer).map_err(|e| e.to_string())?;
    server.withdraw(&exposed).map_err(|e| e.to_string())?;
    println!("rdma-test: passed");
    Ok(())
}

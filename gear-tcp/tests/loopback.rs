//! The TCP transport against a real server on loopback.

// tonic fixes the interceptor's error type as `Status`.
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gear_core::{Error, HeapRegion, ReadOp, RemoteAccess, RemoteRegion, TcpEndpoint, Transport, TransportServer};
use gear_tcp::{TcpConfig, TcpServer, TcpTransport};
use tonic::service::interceptor::InterceptedService;

fn region_with(len: usize, f: impl Fn(usize) -> u8) -> Arc<HeapRegion> {
    Arc::new(HeapRegion::from_fn(len, f))
}

fn bytes_of(r: &HeapRegion) -> &[u8] {
    // SAFETY: callers read a region only after every read into it finished.
    unsafe { r.bytes() }
}

const TOKEN: &str = "Bearer loopback-token-0123456789";

/// Serves `server`'s regions on loopback behind a token check, on a
/// runtime kept alive by the returned value.
fn serve(chunk: usize) -> (Arc<TcpServer>, SocketAddr, tokio::runtime::Runtime) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Arc::new(TcpServer::with_chunk_bytes(addr.to_string(), chunk).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let service = InterceptedService::new(server.service(), |req: tonic::Request<()>| {
        match req.metadata().get("authorization") {
            Some(v) if v == TOKEN => Ok(req),
            _ => Err(tonic::Status::unauthenticated("missing or wrong token")),
        }
    });
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (server, addr, runtime)
}

fn transport(token: Option<&str>, call_timeout: Duration) -> TcpTransport {
    let headers = token.map(|t| vec![("authorization".to_owned(), t.to_owned())]).unwrap_or_default();
    TcpTransport::new(TcpConfig { headers, call_timeout, ..TcpConfig::default() }).unwrap()
}

fn connect(t: &TcpTransport, server: &TcpServer, exposed: &gear_core::ExposedRegion) -> gear_core::RemoteHandle {
    let pending = t.prepare_connection(exposed.shard()).unwrap();
    let remote = server.accept(exposed, &pending.endpoint).unwrap();
    t.connect(pending, &remote).unwrap()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

#[test]
fn reads_land_byte_exact_across_chunks() {
    let (server, _addr, _rt) = serve(4096);
    let remote_bytes = region_with(1 << 20, |i| (i * 31 + i / 4099) as u8);
    let exposed = server.expose(2, 9, remote_bytes.clone()).unwrap();
    let t = transport(Some(TOKEN), Duration::from_secs(10));
    let handle = connect(&t, &server, &exposed);
    assert_eq!(handle.shard(), 2);
    let local = region_with(300_000, |_| 0xEE);
    let buf = t.register_local(local.clone()).unwrap();
    let ops = [
        ReadOp { remote_offset: 5, local_offset: 0, len: 10_000 },
        ReadOp { remote_offset: 900_000, local_offset: 10_000, len: 0 },
        ReadOp { remote_offset: 1_000_000, local_offset: 10_000, len: 48_576 },
        ReadOp { remote_offset: 3, local_offset: 100_000, len: 150_001 },
        ReadOp { remote_offset: 1_048_568, local_offset: 299_992, len: 8 },
    ];
    // Twice: the buffer is reused across batches.
    for _ in 0..2 {
        let ticket = t.post_reads(&handle, &buf, &ops).unwrap();
        t.wait(&ticket, far()).unwrap();
        assert!(matches!(t.wait(&ticket, far()), Err(Error::InvalidHandle(_))), "a ticket finishes once");
        let (src, dst) = (bytes_of(&remote_bytes), bytes_of(&local));
        for op in ops {
            let (r, l, n) = (op.remote_offset as usize, op.local_offset as usize, op.len as usize);
            assert_eq!(&dst[l..l + n], &src[r..r + n], "op {op:?}");
        }
        assert!(dst[58_576..100_000].iter().all(|&b| b == 0xEE), "bytes outside the ops stay");
    }
    // Several tickets in flight at once, then one wait_all.
    let tickets: Vec<_> = (0..4).map(|_| t.post_reads(&handle, &buf, &ops[..1]).unwrap()).collect();
    assert!(t.wait_all(&tickets, far()).iter().all(|r| r.is_ok()));
    let empty = t.post_reads(&handle, &buf, &[]).unwrap();
    assert!(t.poll(&empty).unwrap());
    t.release_local(&buf).unwrap();
    assert!(matches!(t.release_local(&buf), Err(Error::InvalidHandle(_))));
    t.disconnect(&handle).unwrap();
}

#[test]
fn out_of_range_reads_are_refused_locally_and_by_the_server() {
    let (server, addr, _rt) = serve(4096);
    let exposed = server.expose(0, 1, region_with(4096, |i| i as u8)).unwrap();
    let t = transport(Some(TOKEN), Duration::from_secs(10));
    let handle = connect(&t, &server, &exposed);
    let buf = t.register_local(region_with(8192, |_| 0)).unwrap();
    let op = |remote_offset, len| ReadOp { remote_offset, local_offset: 0, len };
    assert!(matches!(t.post_reads(&handle, &buf, &[op(4000, 97)]), Err(Error::Region(_))));
    assert!(matches!(t.post_reads(&handle, &buf, &[op(u64::MAX, 2)]), Err(Error::Region(_))));

    // A descriptor that claims more than the server exposed: the server
    // refuses the read.
    let liar = RemoteRegion {
        shard: 0,
        incarnation: 1,
        len: 8192,
        access: RemoteAccess::Tcp { peer: TcpEndpoint { address: addr.to_string() }, region_id: exposed.id() },
    };
    let pending = t.prepare_connection(0).unwrap();
    let lying = t.connect(pending, &liar).unwrap();
    let ticket = t.post_reads(&lying, &buf, &[op(0, 100), op(4000, 200)]).unwrap();
    match t.wait(&ticket, far()) {
        Err(Error::RemoteRead { failed, total_ops: 2, reason, .. }) => {
            assert_eq!(failed, vec![0, 1]);
            assert!(reason.contains("out of bounds"), "{reason}");
        }
        other => panic!("expected a refused read, got {other:?}"),
    }

    // A region id the server never issued.
    let wrong = RemoteRegion {
        access: RemoteAccess::Tcp { peer: TcpEndpoint { address: addr.to_string() }, region_id: 777 },
        ..liar
    };
    let pending = t.prepare_connection(0).unwrap();
    let stranger = t.connect(pending, &wrong).unwrap();
    let ticket = t.post_reads(&stranger, &buf, &[op(0, 8)]).unwrap();
    match t.wait(&ticket, far()) {
        Err(Error::RemoteRead { reason, .. }) => assert!(reason.contains("not exposed"), "{reason}"),
        other => panic!("expected an unknown region, got {other:?}"),
    }

    // Without the token.
    let anonymous = transport(None, Duration::from_secs(10));
    let h = connect(&anonymous, &server, &exposed);
    let b = anonymous.register_local(region_with(64, |_| 0)).unwrap();
    let ticket = anonymous.post_reads(&h, &b, &[op(0, 8)]).unwrap();
    match anonymous.wait(&ticket, far()) {
        Err(Error::RemoteRead { reason, .. }) => assert!(reason.contains("token"), "{reason}"),
        other => panic!("expected an unauthenticated read, got {other:?}"),
    }

    // Descriptors of another transport or shard.
    let pending = t.prepare_connection(5).unwrap();
    assert!(matches!(t.connect(pending, &wrong), Err(Error::Descriptor(_))));
}

#[test]
fn a_pending_connection_ends_in_one_connect_or_abort() {
    let (server, _addr, _rt) = serve(4096);
    let exposed = server.expose(0, 1, region_with(4096, |i| i as u8)).unwrap();
    let t = transport(Some(TOKEN), Duration::from_secs(10));
    let again =
        |p: &gear_core::PendingConnection| gear_core::PendingConnection { id: p.id, endpoint: p.endpoint.clone() };

    let pending = t.prepare_connection(0).unwrap();
    let copy = again(&pending);
    t.abort(pending).unwrap();
    assert!(matches!(t.abort(again(&copy)), Err(Error::InvalidHandle(_))), "aborted once");
    let remote = server.accept(&exposed, &copy.endpoint).unwrap();
    assert!(matches!(t.connect(copy, &remote), Err(Error::InvalidHandle(_))), "an aborted connection is gone");

    // A refused descriptor consumes the pending connection too.
    let pending = t.prepare_connection(0).unwrap();
    let copy = again(&pending);
    let other_shard = RemoteRegion { shard: 3, ..remote.clone() };
    assert!(matches!(t.connect(pending, &other_shard), Err(Error::Descriptor(_))));
    assert!(matches!(t.connect(again(&copy), &remote), Err(Error::InvalidHandle(_))));
    assert!(matches!(t.abort(copy), Err(Error::InvalidHandle(_))));
}

#[test]
fn a_silent_server_times_out_and_disconnect_ends_the_reads() {
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let t = transport(None, Duration::from_secs(30));
    let remote = RemoteRegion {
        shard: 1,
        incarnation: 1,
        len: 1 << 20,
        access: RemoteAccess::Tcp { peer: TcpEndpoint { address: addr.to_string() }, region_id: 1 },
    };
    let pending = t.prepare_connection(1).unwrap();
    let handle = t.connect(pending, &remote).unwrap();
    let buf = t.register_local(region_with(4096, |_| 0)).unwrap();
    let ticket = t.post_reads(&handle, &buf, &[ReadOp { remote_offset: 0, local_offset: 0, len: 4096 }]).unwrap();
    assert!(matches!(t.wait(&ticket, Instant::now() + Duration::from_millis(200)), Err(Error::Timeout(_))));
    assert!(!t.poll(&ticket).unwrap(), "still in flight after the timeout");
    assert!(matches!(t.release_local(&buf), Err(Error::Busy(_))));
    t.disconnect(&handle).unwrap();
    match t.wait(&ticket, far()) {
        Err(Error::RemoteRead { failed, shard: 1, .. }) => assert_eq!(failed, vec![0]),
        other => panic!("expected the read to end with an error, got {other:?}"),
    }
    t.release_local(&buf).unwrap();
    assert!(matches!(t.post_reads(&handle, &buf, &[]), Err(Error::InvalidHandle(_))));
    drop(silent);
}

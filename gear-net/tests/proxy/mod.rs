//! A TCP proxy between a client and a shard that can stop forwarding: the
//! network partition (or the frozen switch) the deadline and keepalive
//! tests need. Bytes from the shard pass while a budget lasts; once it is
//! spent the proxy holds them (reads nothing more from the shard), as a
//! link that stopped delivering would. Bytes from the client can be held
//! too, while the proxy still notices the client closing its side.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the proxy's threads share.
#[derive(Default)]
struct Shared {
    /// Bytes from the shard still to be forwarded (`u64::MAX`: no limit).
    budget: AtomicU64,
    /// Bytes from the client are read and dropped instead of forwarded.
    hold_client: AtomicBool,
    /// A client closed its side of a connection.
    client_closed: AtomicBool,
    /// Everything ends.
    stop: AtomicBool,
}

/// A proxy listening on loopback, forwarding to one upstream address.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Starts forwarding every connection to `upstream`, without limit.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared { budget: AtomicU64::new(u64::MAX), ..Shared::default() });
        let s = shared.clone();
        std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(shard) = TcpStream::connect(upstream) else { continue };
                        client.set_nonblocking(false).unwrap();
                        let _ = client.set_nodelay(true);
                        let _ = shard.set_nodelay(true);
                        let (c2, s2) = (client.try_clone().unwrap(), shard.try_clone().unwrap());
                        let (sa, sb) = (s.clone(), s.clone());
                        std::thread::spawn(move || from_client(client, shard, &sa));
                        std::thread::spawn(move || from_shard(s2, c2, &sb));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Proxy { addr, shared }
    }

    /// The address clients dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forwards at most `bytes` more bytes from the shard, then holds them.
    pub fn pass_from_shard(&self, bytes: u64) {
        self.shared.budget.store(bytes, Ordering::SeqCst);
    }

    /// Bytes from the shard still to be forwarded before the proxy holds
    /// them (`u64::MAX`: no limit).
    #[allow(dead_code)]
    pub fn budget_left(&self) -> u64 {
        self.shared.budget.load(Ordering::SeqCst)
    }

    /// Stops forwarding in both directions (a partition).
    pub fn partition(&self) {
        self.shared.budget.store(0, Ordering::SeqCst);
        self.shared.hold_client.store(true, Ordering::SeqCst);
    }

    /// Whether a client closed a connection through the proxy.
    pub fn client_closed(&self) -> bool {
        self.shared.client_closed.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn from_client(mut client: TcpStream, mut shard: TcpStream, s: &Shared) {
    let mut buf = vec![0u8; 64 << 10];
    let _ = client.set_read_timeout(Some(Duration::from_millis(50)));
    while !s.stop.load(Ordering::Relaxed) {
        match client.read(&mut buf) {
            Ok(0) => {
                s.client_closed.store(true, Ordering::SeqCst);
                break;
            }
            Ok(n) if !s.hold_client.load(Ordering::SeqCst) => {
                if shard.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => {
                s.client_closed.store(true, Ordering::SeqCst);
                break;
            }
        }
    }
    let _ = shard.shutdown(std::net::Shutdown::Both);
}

fn from_shard(mut shard: TcpStream, mut client: TcpStream, s: &Shared) {
    let mut buf = vec![0u8; 64 << 10];
    // Read from the shard, not yet forwarded: bytes pass only while the
    // budget at the moment they would be sent allows.
    let mut pending: Vec<u8> = Vec::new();
    let _ = shard.set_read_timeout(Some(Duration::from_millis(50)));
    while !s.stop.load(Ordering::Relaxed) {
        if !pending.is_empty() {
            let budget = s.budget.load(Ordering::SeqCst);
            let n = pending.len().min(usize::try_from(budget).unwrap_or(usize::MAX));
            if n == 0 {
                // Held.
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let spend = |b: u64| Some(if b == u64::MAX { b } else { b.saturating_sub(n as u64) });
            let _ = s.budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, spend);
            if client.write_all(&pending[..n]).is_err() {
                break;
            }
            pending.drain(..n);
            continue;
        }
        if s.budget.load(Ordering::SeqCst) == 0 {
            // Held: nothing more is read from the shard either.
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        match shard.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
}

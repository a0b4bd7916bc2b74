//! The HTTP endpoint of the metrics: `GET /metrics` on the `[metrics]`
//! address, served by hyper's HTTP/1 server on a thread of its own (so a
//! scrape never competes with the gRPC runtime, and a server without gRPC
//! can have metrics too).
//!
//! The endpoint has no token: bind it to an address only the monitoring
//! system reaches. It answers nothing but the metrics, holds at most
//! [`MAX_CONNECTIONS`] connections and drops one whose request headers take
//! longer than [`HEADER_TIMEOUT`].

use crate::error::{Error, Result};
use crate::server::ServedTables;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;

/// Longest a client may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The `[metrics]` section of a `gear serve` config.
///
/// ```toml
/// [metrics]
/// listen = "0.0.0.0:9090"   # GET http://host:9090/metrics
/// ```
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address the HTTP endpoint listens on (port 0 picks a free port).
    pub listen: SocketAddr,
}

/// The metrics endpoint of one server; stops when dropped.
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer").field("local_addr", &self.local_addr).finish()
    }
}

/// The text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(
    req: Request<Incoming>,
    tables: ServedTables,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/metrics" {
        return Ok(respond(StatusCode::NOT_FOUND, "text/plain", "not found: the metrics are at /metrics\n"));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET /metrics\n");
        r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    // Reading a table's counters takes its lock: off the reactor.
    Ok(match tokio::task::spawn_blocking(move || tables.metrics_text()).await {
        Ok(text) => respond(StatusCode::OK, CONTENT_TYPE, text),
        Err(e) => {
            respond(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("reading the metrics failed: {e}\n"))
        }
    })
}

impl MetricsServer {
    /// Binds `config.listen` and serves `tables`' metrics there.
    pub fn start(config: &MetricsConfig, tables: ServedTables) -> Result<Self> {
        let listener = std::net::TcpListener::bind(config.listen)
            .map_err(|e| Error::Config(format!("metrics: cannot listen on {}: {e}", config.listen)))?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("gear-metrics".into()).spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
                loop {
                    let permit = tokio::select! {
                        _ = &mut stopped => return,
                        permit = slots.clone().acquire_owned() => match permit {
                            Ok(permit) => permit,
                            Err(_) => return,
                        },
                    };
                    let accepted = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => accepted,
                    };
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        // Out of descriptors, say: try again shortly.
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let tables = tables.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| handle(req, tables.clone()));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_TIMEOUT)
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        drop(permit);
                    });
                }
            });
        })?;
        Ok(MetricsServer { local_addr, stop: Some(stop), thread: Some(thread) })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

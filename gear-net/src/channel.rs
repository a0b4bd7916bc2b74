//! The client's HTTP/2 connection to one shard, with large DATA frames.
//!
//! HTTP/2 splits a message into DATA frames no larger than the receiver
//! advertises (`SETTINGS_MAX_FRAME_SIZE`, 16 KiB unless raised). tonic
//! 0.12's `Endpoint` cannot raise it, so every sample reply (MiB of window
//! bytes) reached the client in 16 KiB frames: measured with
//! `gear bench --shards 3`, the same cut on the insert side costs 0.6-0.7
//! CPU seconds per GB. Over plain TCP this module therefore connects with
//! hyper's own HTTP/2 client (the one tonic's channel is built on), which
//! can advertise larger frames (1 MiB); over TLS it keeps tonic's channel.
//!
//! Either way a [`ShardChannel`] behaves like tonic's: connections open on
//! first use and reopen after a failure (a restarted shard rejoins), and
//! failures become statuses with the codes the client acts on
//! (`Unavailable` for a shard that cannot be reached or a connection that
//! broke). Every connection sends HTTP/2 keepalive pings, idle or not, and
//! closes when one goes unanswered for the ping timeout, so a connection to
//! a frozen or partitioned shard does not outlive its silence; the calls on
//! it then fail with `Unavailable`, and the next call connects anew.
//!
//! Deadlines are the client's: it puts each whole call (request, response
//! headers, body and trailers) under one (`client::cluster`), since a
//! deadline here could cover only the response headers, which a shard
//! sends before it draws the batch.

use crate::error::{Error, Result};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::BoxBody;
use tonic::codegen::http::uri::{Authority, Scheme};
use tonic::codegen::http::{Request, Response, Uri};
use tonic::codegen::Service;
use tonic::transport::Channel;
use tonic::Status;

/// Largest HTTP/2 frame the client accepts. Not the protocol's maximum
/// (16 MiB): h2 buffers a whole frame before handing it over, so a reply of
/// a few MiB in one frame left the socket for memory and came back for the
/// copy into the rows; in 1 MiB frames it is copied out while still in
/// cache (`gear bench --shards 3`, alternated: remote sample 0.75 of the
/// plain stream against 0.67; 512 KiB to 4 MiB all fell between).
const MAX_FRAME_BYTES: u32 = 1 << 20;
/// Per-stream receive window: a whole sample reply of a few MiB in flight.
const STREAM_WINDOW_BYTES: u32 = 8 << 20;
/// Per-connection receive window.
const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;

/// How one shard is reached (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct ShardChannel {
    inner: Inner,
}

#[derive(Clone, Debug)]
// hyper's client is a few `Arc`s: cloning it per call (every call clones
// its channel) must not allocate, so it is not boxed.
#[allow(clippy::large_enum_variant)]
enum Inner {
    /// Plain TCP through hyper's client, with large frames.
    Plain { client: Client<HttpConnector, BoxBody>, authority: Authority },
    /// TLS through tonic's channel.
    Tonic(Channel),
}

/// Settings of a [`ShardChannel`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChannelSettings {
    /// Deadline of a connection attempt.
    pub connect_timeout: Duration,
    /// How often a connection pings its shard (HTTP/2 PING), idle or not.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
}

impl ShardChannel {
    /// A lazily connecting channel to `addr` (`host:port`), over TLS when
    /// `tls` is given. Must be called inside a tokio runtime.
    pub(crate) fn new(addr: &str, tls: Option<&crate::tls::ClientTls>, settings: ChannelSettings) -> Result<Self> {
        if tls.is_some() {
            let channel = crate::tls::endpoint(addr, tls)?
                .connect_timeout(settings.connect_timeout)
                .http2_keep_alive_interval(settings.keepalive_interval)
                .keep_alive_timeout(settings.keepalive_timeout)
                .keep_alive_while_idle(true)
                .tcp_nodelay(true)
                .initial_stream_window_size(Some(STREAM_WINDOW_BYTES))
                .initial_connection_window_size(Some(CONNECTION_WINDOW_BYTES))
                .connect_lazy();
            return Ok(ShardChannel { inner: Inner::Tonic(channel) });
        }
        let authority: Authority =
            addr.parse().map_err(|e| Error::Config(format!("shard address `{addr}` is not host:port: {e}")))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(settings.connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_only(true)
            .http2_max_frame_size(MAX_FRAME_BYTES)
            .http2_initial_stream_window_size(STREAM_WINDOW_BYTES)
            .http2_initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .http2_keep_alive_interval(settings.keepalive_interval)
            .http2_keep_alive_timeout(settings.keepalive_timeout)
            .http2_keep_alive_while_idle(true)
            .build(connector);
        Ok(ShardChannel { inner: Inner::Plain { client, authority } })
    }
}

/// What a failed call through hyper's client means to the cluster client.
fn hyper_status(e: &hyper_util::client::legacy::Error) -> Status {
    // hyper's own message is generic ("client error (Connect)"); the cause
    // (connection refused, no route, reset) is in its sources.
    let mut why = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        why.push_str(": ");
        why.push_str(&cause.to_string());
        source = cause.source();
    }
    if e.is_connect() {
        Status::unavailable(format!("cannot connect: {why}"))
    } else {
        // The connection broke or the peer reset the stream: the shard is
        // gone or restarting, which the client handles like a refused
        // connection.
        Status::unavailable(format!("connection failed: {why}"))
    }
}

impl Service<Request<BoxBody>> for ShardChannel {
    type Response = Response<BoxBody>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Response<BoxBody>, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Status>> {
        match &mut self.inner {
            // hyper's pool connects inside the call.
            Inner::Plain { .. } => Poll::Ready(Ok(())),
            Inner::Tonic(channel) => {
                channel.poll_ready(cx).map_err(|e| Status::unavailable(format!("cannot connect: {e}")))
            }
        }
    }

    fn call(&mut self, mut request: Request<BoxBody>) -> Self::Future {
        match &mut self.inner {
            Inner::Plain { client, authority } => {
                let path = request.uri().path_and_query().cloned();
                let uri = Uri::builder().scheme(Scheme::HTTP).authority(authority.clone());
                let uri = match path {
                    Some(p) => uri.path_and_query(p),
                    None => uri.path_and_query("/"),
                };
                match uri.build() {
                    Ok(uri) => *request.uri_mut() = uri,
                    Err(e) => {
                        let status = Status::internal(format!("request uri: {e}"));
                        return Box::pin(async move { Err(status) });
                    }
                }
                let call = client.request(request);
                Box::pin(async move {
                    match call.await {
                        Err(e) => Err(hyper_status(&e)),
                        Ok(response) => Ok(response.map(tonic::body::boxed)),
                    }
                })
            }
            Inner::Tonic(channel) => {
                let call = channel.call(request);
                Box::pin(async move { call.await.map_err(|e| Status::from_error(Box::new(e))) })
            }
        }
    }
}

impl ShardChannel {
    /// Sends `request` (waiting until the channel is ready, as tower
    /// services require) and returns the response once its headers came;
    /// its body is read by the caller.
    pub(crate) async fn send(&self, request: Request<BoxBody>) -> std::result::Result<Response<BoxBody>, Status> {
        let mut channel = self.clone();
        std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
        channel.call(request).await
    }
}

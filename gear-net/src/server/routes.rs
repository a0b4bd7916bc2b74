//! The shard's methods served without tonic's codec, in front of the
//! generated service: `Insert` (`insert_route.rs`: no decode buffer), the
//! `Sample` calls that let the shard send from table memory
//! (`sample_route.rs`: no gather), and `SampleStream`, whose exchanges
//! are `Sample` calls (`sample_stream.rs`). [`HandRoutes`] checks their token as the
//! interceptor checks every other call's, then hands them to their module;
//! every other call goes to the generated service unchanged.

use super::{insert_route, sample_route, sample_stream, ShardService};
use crate::auth::TokenCheck;
use crate::body::{INSERT_PATH, SAMPLE_PATH, SAMPLE_STREAM_PATH};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::BoxBody;
use tonic::codegen::http;
use tonic::codegen::Service;
use tonic::server::NamedService;

/// The methods this module serves.
#[derive(Clone, Copy)]
enum Route {
    Insert,
    Sample,
    SampleStream,
}

/// `inner` (the generated service behind the token check), with `Insert`,
/// `Sample` and `SampleStream` taken by this module's routes (module doc).
#[derive(Clone)]
pub(crate) struct HandRoutes<S> {
    inner: S,
    service: Arc<ShardService>,
    token: TokenCheck,
    max_message_bytes: usize,
}

impl<S> HandRoutes<S> {
    /// Routes `Insert`, `Sample` and `SampleStream` calls for `service` (checked against
    /// `token`, messages of at most `max_message_bytes`) and every other
    /// call to `inner`.
    pub(crate) fn new(inner: S, service: Arc<ShardService>, token: TokenCheck, max_message_bytes: usize) -> Self {
        HandRoutes { inner, service, token, max_message_bytes }
    }
}

impl<S: NamedService> NamedService for HandRoutes<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<BoxBody>> for HandRoutes<S>
where
    S: Service<http::Request<BoxBody>, Response = http::Response<BoxBody>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<BoxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<BoxBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<BoxBody>) -> Self::Future {
        let route = match request.uri().path() {
            INSERT_PATH => Route::Insert,
            SAMPLE_PATH => Route::Sample,
            SAMPLE_STREAM_PATH => Route::SampleStream,
            _ => return Box::pin(self.inner.call(request)),
        };
        let (service, token, max) = (self.service.clone(), self.token.clone(), self.max_message_bytes);
        // The generated service is ready whenever this route is (it always
        // is: tonic's services hold no queue), so a clone may be called.
        let inner = self.inner.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            if let Err(status) = token.check(parts.headers.get(http::header::AUTHORIZATION).map(|v| v.as_bytes())) {
                return Ok(status.into_http());
            }
            Ok(match route {
                Route::Insert => insert_route::serve(&service, body, max).await,
                Route::Sample => sample_route::serve(&service, inner, parts, body, max).await,
                Route::SampleStream => sample_stream::serve(service, inner, parts, body, max),
            })
        })
    }
}

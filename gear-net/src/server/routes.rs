//! The shard's methods served without tonic's codec, in front of the
//! generated service: `Insert` (`insert_route.rs`: no decode buffer) and
//! the `Sample` calls that let the shard send from table memory
//! (`sample_route.rs`: no gather). [`HandRoutes`] checks their token as the
//! interceptor checks every other call's, then hands them to their module;
//! every other call goes to the generated service unchanged.

use super::{insert_route, sample_route, ShardService};
use crate::auth::TokenCheck;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::BoxBody;
use tonic::codegen::http;
use tonic::codegen::Service;
use tonic::server::NamedService;

/// The `Insert` method's path.
const INSERT_PATH: &str = "/gear.v1.Shard/Insert";

/// The `Sample` method's path.
const SAMPLE_PATH: &str = "/gear.v1.Shard/Sample";

/// `inner` (the generated service behind the token check), with `Insert`
/// and `Sample` taken by this module's routes (module doc).
#[derive(Clone)]
pub(crate) struct HandRoutes<S> {
    inner: S,
    service: Arc<ShardService>,
    token: TokenCheck,
    max_message_bytes: usize,
}

impl<S> HandRoutes<S> {
    /// Routes `Insert` and `Sample` calls for `service` (checked against
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
        let insert = match request.uri().path() {
            INSERT_PATH => true,
            SAMPLE_PATH => false,
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
            Ok(if insert {
                insert_route::serve(&service, body, max).await
            } else {
                sample_route::serve(&service, inner, parts, body, max).await
            })
        })
    }
}

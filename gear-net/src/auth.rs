//! The cluster token: every call carries `authorization: Bearer <token>`.

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Shortest token accepted: a shorter one is guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// The environment variable a token is read from when the config names none.
pub const TOKEN_ENV: &str = "GEAR_TOKEN";

/// Checks a token's shape (length, printable ASCII so it fits a header).
pub fn check_token(token: &str) -> crate::Result<()> {
    if token.len() < MIN_TOKEN_LEN {
        return Err(crate::Error::Config(format!(
            "cluster token has {} characters, at least {MIN_TOKEN_LEN} are needed",
            token.len()
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(crate::Error::Config("cluster token must be printable ASCII without spaces".into()));
    }
    Ok(())
}

/// Resolves the token: the given one, else `$GEAR_TOKEN`.
pub fn resolve_token(configured: Option<&str>) -> crate::Result<String> {
    let token = match configured {
        Some(t) => t.to_owned(),
        None => std::env::var(TOKEN_ENV).map_err(|_| {
            crate::Error::Config(format!("no cluster token: set `token` in the config or the {TOKEN_ENV} variable"))
        })?,
    };
    check_token(&token)?;
    Ok(token)
}

/// Equality whose time does not depend on where two strings differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Server side: refuses calls without the token.
#[derive(Clone, Debug)]
pub struct TokenCheck {
    expected: Vec<u8>,
}

impl TokenCheck {
    /// Accepts calls carrying `token`.
    pub fn new(token: &str) -> Self {
        TokenCheck { expected: format!("Bearer {token}").into_bytes() }
    }

    /// Checks a call's `authorization` header value (`None`: it had none).
    pub(crate) fn check(&self, authorization: Option<&[u8]>) -> Result<(), Status> {
        match authorization {
            Some(v) if same_bytes(v, &self.expected) => Ok(()),
            Some(_) => Err(Status::unauthenticated("wrong cluster token")),
            None => Err(Status::unauthenticated("missing cluster token")),
        }
    }
}

impl Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(request.metadata().get("authorization").map(|v| v.as_bytes()))?;
        Ok(request)
    }
}

/// Client side: adds the token to every call.
#[derive(Clone, Debug)]
pub struct TokenAttach {
    header: MetadataValue<tonic::metadata::Ascii>,
}

impl TokenAttach {
    /// Attaches `token` (which must be printable ASCII).
    pub fn new(token: &str) -> crate::Result<Self> {
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| crate::Error::Config("cluster token must be printable ASCII without spaces".into()))?;
        Ok(TokenAttach { header })
    }
}

impl Interceptor for TokenAttach {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert("authorization", self.header.clone());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        let mut check = TokenCheck::new("0123456789abcdef");
        let mut attach = TokenAttach::new("0123456789abcdef").unwrap();
        assert!(check.call(attach.call(Request::new(())).unwrap()).is_ok());
        let mut wrong = TokenAttach::new("0123456789abcdeX").unwrap();
        assert_eq!(check.call(wrong.call(Request::new(())).unwrap()).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(check.call(Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(check_token("short").is_err());
        assert!(check_token("0123456789 abcdef").is_err());
    }
}

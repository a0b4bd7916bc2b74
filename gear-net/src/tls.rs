//! TLS for the cluster: rustls (tonic's `tls` feature, `ring` provider).
//!
//! A server with `tls_cert` and `tls_key` in its `[grpc]` section accepts
//! only TLS; with `tls_client_ca` as well it also asks every client for a
//! certificate signed by that CA (mutual TLS). A client with
//! [`ClusterConfig::tls`](crate::ClusterConfig::tls) trusts only the CA it
//! is given (no system roots: a cluster has its own CA) and checks the
//! server's certificate against `domain` (else the host of each address).
//! The cluster token is checked over TLS as over plain TCP.
//!
//! PEM files are read and parsed when the server starts or the client
//! config is built, so a wrong path or content is an error naming the file
//! rather than a failed handshake later.

use crate::error::{Error, Result};
use std::io::Cursor;
use std::path::Path;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// What a client needs for TLS towards the shards.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// The CA certificate(s) the shards' certificates are signed by (PEM).
    pub ca_pem: Vec<u8>,
    /// The name the shards' certificates carry (else each address's host).
    pub domain: Option<String>,
    /// The client's certificate and key (PEM), for servers that ask for one.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("domain", &self.domain)
            .field("identity", &self.identity_pem.is_some())
            .finish()
    }
}

impl ClientTls {
    /// Trusts the CA in `ca_pem` (checked to hold at least one certificate).
    pub fn new(ca_pem: Vec<u8>, domain: Option<String>) -> Result<Self> {
        check_certs(&ca_pem, "the CA certificate")?;
        Ok(ClientTls { ca_pem, domain, identity_pem: None })
    }

    /// Trusts the CA in the PEM file `ca`.
    pub fn from_file(ca: &Path, domain: Option<String>) -> Result<Self> {
        let ca_pem = read_certs(ca)?;
        Ok(ClientTls { ca_pem, domain, identity_pem: None })
    }

    /// Presents the certificate and key in the PEM files `cert` and `key`
    /// (mutual TLS).
    pub fn with_identity_files(mut self, cert: &Path, key: &Path) -> Result<Self> {
        self.identity_pem = Some((read_certs(cert)?, read_key(key)?));
        Ok(self)
    }

    /// The endpoint of `addr` (`host:port`) over TLS.
    pub(crate) fn endpoint(&self, addr: &str) -> Result<Endpoint> {
        let endpoint = Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| Error::Config(format!("shard address `{addr}`: {e}")))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        if let Some((cert, key)) = &self.identity_pem {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint.tls_config(tls).map_err(|e| Error::Config(format!("TLS towards `{addr}`: {e}")))
    }
}

/// The endpoint of shard `addr`: plain TCP, or TLS when `tls` is given.
pub(crate) fn endpoint(addr: &str, tls: Option<&ClientTls>) -> Result<Endpoint> {
    match tls {
        Some(tls) => tls.endpoint(addr),
        None => Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Error::Config(format!("shard address `{addr}`: {e}"))),
    }
}

/// The server's TLS settings from its `[grpc]` section's files (`None`
/// without `tls_cert`).
pub(crate) fn server_tls(config: &crate::ServerConfig) -> Result<Option<ServerTlsConfig>> {
    let (cert, key) = match (&config.tls_cert, &config.tls_key) {
        (None, None) if config.tls_client_ca.is_some() => {
            return Err(Error::Config("[grpc] tls_client_ca needs tls_cert and tls_key".into()))
        }
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => return Err(Error::Config("[grpc] tls_cert needs tls_key".into())),
        (None, Some(_)) => return Err(Error::Config("[grpc] tls_key needs tls_cert".into())),
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read_certs(cert)?, read_key(key)?));
    if let Some(ca) = &config.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read_certs(ca)?));
    }
    Ok(Some(tls))
}

/// The server builder, with TLS when the config names a certificate; bad
/// files are refused here, before the server starts.
pub(crate) fn server_builder(config: &crate::ServerConfig) -> Result<tonic::transport::Server> {
    let builder = tonic::transport::Server::builder();
    match server_tls(config)? {
        Some(tls) => builder.tls_config(tls).map_err(|e| Error::Config(format!("[grpc] TLS settings: {e}"))),
        None => Ok(builder),
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Config(format!("cannot read {what} {}: {e}", path.display())))
}

/// Checks that `pem` holds at least one certificate.
fn check_certs(pem: &[u8], what: &str) -> Result<()> {
    let certs = rustls_pemfile::certs(&mut Cursor::new(pem))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("{what}: malformed PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Config(format!("{what}: no PEM certificate (-----BEGIN CERTIFICATE-----) found")));
    }
    Ok(())
}

/// Reads a PEM file holding at least one certificate.
fn read_certs(path: &Path) -> Result<Vec<u8>> {
    let pem = read(path, "certificate")?;
    check_certs(&pem, &format!("certificate {}", path.display()))?;
    Ok(pem)
}

/// Reads a PEM file holding a private key (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<Vec<u8>> {
    let pem = read(path, "private key")?;
    match rustls_pemfile::private_key(&mut Cursor::new(&pem)) {
        Ok(Some(_)) => Ok(pem),
        Ok(None) => Err(Error::Config(format!("private key {}: no PEM private key found", path.display()))),
        Err(e) => Err(Error::Config(format!("private key {}: malformed PEM: {e}", path.display()))),
    }
}

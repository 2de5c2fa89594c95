//! The HTTP client of a public-only sink ([`AddressPolicy::PublicOnly`]): every address a name
//! resolves to is checked at connection time, so a check made earlier cannot be passed by DNS
//! rebinding; a literal address was checked with the endpoint already (the resolver never sees
//! one). Redirects are not followed (a redirect to a literal address would skip the resolver)
//! and no proxy from the environment is used (the proxy would resolve and connect instead).

use std::net::ToSocketAddrs;
use std::sync::Arc;

use object_store::ClientOptions;
use object_store::client::{HttpClient, HttpConnector};

use super::timeouts::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use crate::endpoint::refused_class;

/// What the resolver answers for a name that resolves to a refused address: found by its type
/// in an error's chain (see [`is_refused_address`]). Names neither the address nor the class,
/// so a tenant learns nothing about the node's network from it.
#[derive(Debug, thiserror::Error)]
#[error("the endpoint resolves to an address this sink may not reach")]
pub(crate) struct RefusedAddress;

/// Whether `e` or one of its sources is a [`RefusedAddress`].
pub(crate) fn is_refused_address(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if err.is::<RefusedAddress>() || err.to_string().contains(&RefusedAddress.to_string()) {
            return true;
        }
        current = err.source();
    }
    false
}

/// Resolves with the system resolver, then refuses the whole name when any address it gives is
/// one [`refused_class`] refuses (a name that mixes public and private addresses is not an S3
/// endpoint anyone needs).
struct PublicResolver;

impl reqwest::dns::Resolve for PublicResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found = tokio::task::spawn_blocking(move || {
                (host.as_str(), 0).to_socket_addrs().map(Vec::from_iter)
            })
            .await
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)??;
            if found.is_empty() || found.iter().any(|a| refused_class(a.ip()).is_some()) {
                return Err(Box::new(RefusedAddress) as Box<dyn std::error::Error + Send + Sync>);
            }
            let addrs: reqwest::dns::Addrs = Box::new(found.into_iter());
            Ok(addrs)
        })
    }
}

/// Builds the client of a public-only sink (the options object_store passes are its defaults:
/// the timeouts are ours, set here as for every other sink).
#[derive(Debug)]
pub(super) struct PublicOnlyConnector {
    /// Whether the endpoint is `http://` (otherwise the client speaks HTTPS only).
    pub(super) allow_http: bool,
}

impl HttpConnector for PublicOnlyConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("queen/", env!("CARGO_PKG_VERSION")))
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(PublicResolver))
            // object_store sizes objects by Content-Length: no transparent decompression.
            .no_gzip()
            .no_brotli()
            .no_zstd()
            .no_deflate()
            .https_only(!self.allow_http)
            .build()
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })?;
        Ok(HttpClient::new(client))
    }
}

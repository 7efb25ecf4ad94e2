//! rustls under tokio-postgres: the three traits through which it starts TLS on a socket. The
//! server's name is read when TLS starts, not when the connection is planned, so that a Unix
//! socket (no name) connects as before.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use deadpool_postgres::tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::tls::Tls;

/// TLS for every connection of a pool, as the URL's settings say. The files are read again
/// when a connection starts TLS, as libpq reads them: a certificate renewed while `run` leads
/// for weeks serves its next connection.
#[derive(Debug, Clone)]
pub(crate) struct MakeTls(pub(crate) Arc<Tls>);

/// TLS for one connection to `host`.
#[derive(Debug)]
pub(crate) struct Connect {
    tls: Arc<Tls>,
    host: String,
}

/// A TLS session over a socket.
#[derive(Debug)]
pub(crate) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> MakeTlsConnect<S> for MakeTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, host: &str) -> Result<Connect, Self::Error> {
        let (tls, host) = (self.0.clone(), host.to_owned());
        Ok(Connect { tls, host })
    }
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, socket: S) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.host).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("the host's name: {e}"))
            })?;
            // Files read off the command's one thread (a slow disk would stall the elector).
            let tls = self.tls;
            let config = tokio::task::spawn_blocking(move || tls.client_config())
                .await
                .map_err(io::Error::other)?
                .map_err(io::Error::other)?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            Ok(Stream(connector.connect(name, socket).await?))
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> deadpool_postgres::tokio_postgres::tls::TlsStream
    for Stream<S>
{
    /// `tls-server-end-point`, from the server's certificate (none where it has no binding).
    fn channel_binding(&self) -> ChannelBinding {
        let certificate = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first());
        match certificate.and_then(|c| super::binding::server_end_point(c)) {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

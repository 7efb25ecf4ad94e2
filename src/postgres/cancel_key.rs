//! The cancel key a connection was given when it started (the `BackendKeyData` message), read
//! without sending anything: the driver writes its cancel request into memory instead of a
//! socket.
//!
//! PostgreSQL's key names the backend process that serves the connection. A pooler gives its
//! clients keys of its own (PgBouncer and pgcat random ones), since one client connection meets
//! many server sessions. So a key whose process id is the session's `pg_backend_pid()` is taken
//! for a connection that reaches its server session directly. A heuristic: a pooler that hands
//! out real backends' keys (pgagroal) passes it, which every prepared answer then checks
//! (`prepared::send`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

/// A connection's cancel key: the process id and the secret it was given at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct CancelKey {
    pub(super) process_id: i32,
    pub(super) secret: i32,
}

/// `client`'s cancel key, or `None` where the driver would not write its cancel request in
/// plain (`sslmode=prefer` with `sslnegotiation=direct`, which the driver refuses).
pub(super) fn of(client: &tokio_postgres::Client) -> Option<CancelKey> {
    let token = client.cancel_token();
    let mut memory = Memory::default();
    let done = {
        let request = token.cancel_query_raw(&mut memory, Plain);
        let mut request = std::pin::pin!(request);
        // Everything it awaits is `Memory`, which is always ready: one poll finishes it.
        request
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
    };
    match done {
        Poll::Ready(Ok(())) => parse(&memory.written),
        Poll::Ready(Err(_)) | Poll::Pending => None,
    }
}

/// The key in the last 16 bytes of `written` if they are a cancel request (length 16, code
/// 80877102, process id, secret; any SSL request comes before it).
fn parse(written: &[u8]) -> Option<CancelKey> {
    let request = written.get(written.len().checked_sub(16)?..)?;
    let word = |at: usize| i32::from_be_bytes(request[at..at + 4].try_into().expect("4 bytes"));
    (word(0) == 16 && word(4) == 80_877_102).then(|| CancelKey {
        process_id: word(8),
        secret: word(12),
    })
}

/// A stream in memory: keeps what is written, and answers every read with `S` (the answer a
/// server gives an SSL request that it will take, so that the driver goes on to [`Plain`]).
#[derive(Default)]
struct Memory {
    written: Vec<u8>,
}

impl AsyncRead for Memory {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() > 0 {
            buf.put_slice(b"S");
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Memory {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A "TLS" that leaves the stream as it is, so that the cancel request lands in [`Memory`]
/// in plain whatever the connection's `sslmode`.
struct Plain;

/// The stream [`Plain`] gives back: the one it was given.
struct PlainStream<S>(S);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsConnect<S> for Plain {
    type Stream = PlainStream<S>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<PlainStream<S>, io::Error>>;

    fn connect(self, stream: S) -> Self::Future {
        std::future::ready(Ok(PlainStream(stream)))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PlainStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PlainStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PlainStream<S> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(process_id: i32, secret: i32) -> Vec<u8> {
        [16, 80_877_102, process_id, secret]
            .iter()
            .flat_map(|w: &i32| w.to_be_bytes())
            .collect()
    }

    #[test]
    fn a_cancel_request_gives_its_key() {
        assert_eq!(
            parse(&request(4242, -7)),
            Some(CancelKey {
                process_id: 4242,
                secret: -7
            })
        );
    }

    #[test]
    fn an_ssl_request_before_it_is_skipped() {
        let mut written: Vec<u8> = [8, 80_877_103]
            .iter()
            .flat_map(|w: &i32| w.to_be_bytes())
            .collect();
        written.extend(request(17, 3));
        assert_eq!(parse(&written).map(|k| k.process_id), Some(17));
    }

    #[test]
    fn anything_else_gives_no_key() {
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&[0; 15]), None);
        assert_eq!(parse(&[0; 16]), None);
        let mut wrong_code = request(1, 2);
        wrong_code[7] ^= 1;
        assert_eq!(parse(&wrong_code), None);
    }
}

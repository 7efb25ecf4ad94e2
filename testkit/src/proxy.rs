//! [`FaultProxy`]: a loopback TCP proxy that can delay, partition or reset connections, or
//! rewrite the server's answers.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Size of one read: a chunk of bytes moved at once.
const CHUNK: usize = 16 * 1024;

/// Chunks read from the server but not yet written to the client, at most,
/// per connection while a delay is set (so at most 4 MiB): past that the
/// proxy stops reading and TCP flow control holds the server back.
const MAX_DELAYED_CHUNKS: usize = 256;

/// What the proxy does with bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    Blackhole,
}

#[derive(Debug)]
struct Shared {
    mode: watch::Sender<Mode>,
    /// Latency added to every chunk from the server to the client.
    delay: watch::Sender<Duration>,
    /// Bumped by `reset()`; every connection accepted before closes.
    reset: watch::Sender<u64>,
    /// Bytes replaced in the server's answers: (what, by what), of one length.
    rewrite: watch::Sender<Option<(Vec<u8>, Vec<u8>)>>,
    /// Where new connections go (current ones stay with the server they reached).
    target: watch::Sender<SocketAddr>,
    accepted: AtomicU64,
    open: AtomicUsize,
}

/// A loopback TCP proxy for fault injection: pass, delay, blackhole, reset, rewrite.
///
/// Listens on `127.0.0.1:<free port>` and forwards each accepted connection
/// to the target. Each setting applies to every connection, current and new:
///
/// - [`pass`](Self::pass) (the default): bytes flow both ways.
/// - [`delay`](Self::delay)`(d)`: a slow network or server, on the answers
///   only. Every chunk of bytes read from the target (the server) is written
///   to the client `d` after it was read, not earlier: a latency of `d` per
///   chunk, not cumulative (chunks read 1 ms apart are written 1 ms apart,
///   each `d` late, so two pipelined queries both take about `d`).
///   Client→server bytes are never delayed, nor is the TCP connect to the
///   target; the server's startup and authentication answers are. It
///   combines with the modes: `delay(Duration::ZERO)` (the default) turns it
///   off, and a blackhole or reset while a delay is set behaves as below.
///   A new delay applies at once to the chunks already waiting (setting zero
///   writes them out now). While a delay is set, up to 256 chunks (4 MiB)
///   per connection wait inside the proxy; past that it stops reading from
///   the server.
/// - [`blackhole`](Self::blackhole): a network partition. Every socket stays
///   open but no byte moves in either direction: the proxy stops reading, so
///   data waits in kernel buffers (and at most one read buffer per direction
///   inside the proxy, plus, with a delay set, the server's chunks read but
///   not yet written: they stay held, and go out once the partition heals and
///   their delay is over). New connections are accepted but not connected to the
///   target. Neither peer sees an error; only timeouts or keepalives can tell.
///   When [`pass`](Self::pass) is called again the partition heals: held bytes
///   are delivered, as TCP retransmission would, and waiting new connections
///   are connected to the target.
/// - [`reset`](Self::reset): closes every current connection at once with
///   `SO_LINGER` 0 on both sides, so the client and the server each see a
///   TCP RST (the server ends the session and releases its locks). New
///   connections are accepted as usual afterwards, in the current mode.
/// - [`retarget`](Self::retarget)`(addr)`: an address that moves (a virtual IP
///   or a DNS name re-pointed at a promoted standby). New connections go to
///   `addr`; current ones stay with the server they reached.
/// - [`rewrite_answers`](Self::rewrite_answers)`(from, to)`: a server that says
///   what it never would. Every `from` in the server's answers becomes `to` (of
///   the same length), until [`stop_rewriting`](Self::stop_rewriting).
///
/// Needs a tokio runtime: its tasks run on the runtime that called
/// [`start`](Self::start). Dropping the proxy stops the listener and closes
/// every connection (its tasks are aborted; the sockets close as soon as the
/// runtime processes that, normally at once).
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("target", &self.target())
            .field("mode", &*self.shared.mode.borrow())
            .field("delay", &*self.shared.delay.borrow())
            .field("accepted", &self.accepted())
            .field("open", &self.open())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy to `target`, listening on `127.0.0.1:0`.
    pub async fn start(target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            mode: watch::Sender::new(Mode::Pass),
            delay: watch::Sender::new(Duration::ZERO),
            reset: watch::Sender::new(0),
            rewrite: watch::Sender::new(None),
            target: watch::Sender::new(target),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        tracing::debug!(%addr, %target, "fault proxy started");
        Ok(FaultProxy { addr, shared, task })
    }

    /// The address to connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address new connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        *self.shared.target.borrow()
    }

    /// Forwards new connections to `target` from now on (an address that moves: a virtual
    /// IP or a DNS name re-pointed at another server). Current connections stay with the
    /// server they reached; [`reset`](Self::reset) ends them.
    pub fn retarget(&self, target: SocketAddr) {
        tracing::debug!(addr = %self.addr, %target, "fault proxy: retarget");
        self.shared.target.send_replace(target);
    }

    /// Forwards bytes both ways (the default). Ends a blackhole.
    pub fn pass(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy: pass");
        self.shared.mode.send_replace(Mode::Pass);
    }

    /// Delays every chunk of bytes from the server to the client by `delay`
    /// (per chunk, not cumulative), on current and new connections;
    /// `Duration::ZERO` turns it off. Client→server bytes are never delayed.
    /// Combines with [`blackhole`](Self::blackhole) and
    /// [`reset`](Self::reset) (see the type docs).
    pub fn delay(&self, delay: Duration) {
        tracing::debug!(addr = %self.addr, ?delay, "fault proxy: delay");
        self.shared.delay.send_replace(delay);
    }

    /// The delay currently set on server→client bytes (zero: none).
    pub fn current_delay(&self) -> Duration {
        *self.shared.delay.borrow()
    }

    /// Starts a partition: sockets stay open, no byte moves either way, new
    /// connections are accepted but not forwarded (see the type docs).
    pub fn blackhole(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy: blackhole");
        self.shared.mode.send_replace(Mode::Blackhole);
    }

    /// Whether the proxy is currently blackholing.
    pub fn is_blackholed(&self) -> bool {
        *self.shared.mode.borrow() == Mode::Blackhole
    }

    /// Closes every current connection now with a TCP RST to both peers;
    /// keeps accepting new ones in the current mode.
    pub fn reset(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy: reset");
        self.shared.reset.send_modify(|n| *n += 1);
    }

    /// Replaces every `from` in the server's answers with `to`, on current and new
    /// connections, to make the server say what it never would (an answer the client does
    /// not know). Both must be non-empty and of one length, so that the protocol's message
    /// lengths stay right; `from` is matched within one chunk read from the server (a whole
    /// small answer, on loopback), not across two. Client→server bytes are never changed.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `from` is empty or the lengths differ.
    pub fn rewrite_answers(&self, from: &[u8], to: &[u8]) -> io::Result<()> {
        if from.is_empty() || from.len() != to.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "rewrite_answers: `from` and `to` must be non-empty and of one length",
            ));
        }
        tracing::debug!(addr = %self.addr, from = %String::from_utf8_lossy(from), to = %String::from_utf8_lossy(to), "fault proxy: rewrite answers");
        self.shared
            .rewrite
            .send_replace(Some((from.to_vec(), to.to_vec())));
        Ok(())
    }

    /// Stops [`rewrite_answers`](Self::rewrite_answers): answers pass unchanged.
    pub fn stop_rewriting(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy: answers unchanged");
        self.shared.rewrite.send_replace(None);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open (accepted and not yet closed).
    pub fn open(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Dropping the accept loop drops its JoinSet, which aborts every
        // connection task and so closes every socket.
        self.task.abort();
    }
}

/// Counts a connection as open for as long as it lives.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(Arc::clone(shared))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard::new(&shared);
                    let mode = shared.mode.subscribe();
                    let delay = shared.delay.subscribe();
                    let reset = shared.reset.subscribe();
                    let rewrite = shared.rewrite.subscribe();
                    let target = shared.target.subscribe();
                    conns.spawn(async move {
                        let _guard = guard;
                        handle(socket, target, mode, delay, reset, rewrite).await;
                    });
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off a little.
                    tracing::debug!(error = %e, "fault proxy: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Serves one connection until it ends or is reset.
async fn handle(
    mut client: TcpStream,
    target: watch::Receiver<SocketAddr>,
    mut mode: watch::Receiver<Mode>,
    delay: watch::Receiver<Duration>,
    mut reset: watch::Receiver<u64>,
    rewrite: watch::Receiver<Option<(Vec<u8>, Vec<u8>)>>,
) {
    let _ = client.set_nodelay(true);
    // Connect to the target only once traffic may flow (never delayed).
    let mut upstream = tokio::select! {
        connected = async {
            wait_for(&mut mode, Mode::Pass).await?;
            let target = *target.borrow();
            TcpStream::connect(target).await
        } => match connected {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, target = %*target.borrow(), "fault proxy: cannot reach target");
                return;
            }
        },
        _ = reset.changed() => {
            abort(&client);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);

    let reset_now = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let (mode_up, mode_down) = (mode.clone(), mode);
        tokio::select! {
            r = async { tokio::try_join!(pump(cr, uw, mode_up), pump_delayed(ur, cw, mode_down, delay, rewrite)) } => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "fault proxy: connection ended with an error");
                }
                false
            }
            _ = reset.changed() => true,
        }
    };
    if reset_now {
        abort(&client);
        abort(&upstream);
    }
}

/// Makes the close of `socket` (on drop) send a RST.
fn abort(socket: &TcpStream) {
    let _ = socket.set_zero_linger();
}

/// Waits until the mode is `want`. Errors if the proxy is gone.
async fn wait_for(mode: &mut watch::Receiver<Mode>, want: Mode) -> io::Result<()> {
    match mode.wait_for(|m| *m == want).await {
        Ok(_) => Ok(()),
        Err(_) => Err(stopped()),
    }
}

fn stopped() -> io::Error {
    io::Error::other("fault proxy stopped")
}

/// Copies `from` to `to` while the mode is `Pass`, pausing (neither reading
/// nor writing) while it is `Blackhole`. On EOF shuts down `to`'s write side.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        wait_for(&mut mode, Mode::Pass).await?;
        let n = tokio::select! {
            r = from.read(&mut buf) => r?,
            r = wait_for(&mut mode, Mode::Blackhole) => { r?; continue; }
        };
        let mut sent = 0;
        while sent < n {
            wait_for(&mut mode, Mode::Pass).await?;
            tokio::select! {
                r = to.write(&buf[sent..n]) => match r? {
                    0 => return Err(io::ErrorKind::WriteZero.into()),
                    k => sent += k,
                },
                r = wait_for(&mut mode, Mode::Blackhole) => r?,
            }
        }
        if n == 0 {
            wait_for(&mut mode, Mode::Pass).await?;
            return to.shutdown().await;
        }
    }
}

/// A chunk read from the server and not yet fully written to the client.
struct Delayed {
    read_at: Instant,
    /// Empty: the server's EOF.
    bytes: Vec<u8>,
    /// How much of `bytes` the client has been sent.
    sent: usize,
}

/// Copies `from` (the server) to `to` (the client) like [`pump`], writing
/// each chunk no earlier than the current delay after it was read.
///
/// One loop drives both ends: it reads while the mode is `Pass` and the
/// queue has room, and writes the queue's head once it is due and the mode
/// is `Pass`. So chunks are late by the delay each, not by the sum of the
/// delays before them. With a zero delay it reads the next chunk only once
/// the last one is written, exactly as [`pump`] does.
async fn pump_delayed(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut mode: watch::Receiver<Mode>,
    mut delay: watch::Receiver<Duration>,
    rewrite: watch::Receiver<Option<(Vec<u8>, Vec<u8>)>>,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut queue: VecDeque<Delayed> = VecDeque::new();
    let mut read_eof = false;
    loop {
        // Mark both as seen: `changed()` below then wakes only on news.
        let passing = *mode.borrow_and_update() == Mode::Pass;
        let lag = *delay.borrow_and_update();
        let now = Instant::now();
        // When the head is due; `None` inside: never (a delay past `Instant`'s range).
        let due = queue.front().map(|c| c.read_at.checked_add(lag));
        let may_read = passing
            && !read_eof
            && queue.len() < MAX_DELAYED_CHUNKS
            && (queue.is_empty() || !lag.is_zero());
        let may_write = passing && matches!(due, Some(Some(d)) if d <= now);
        // Sleep until the head is due, unless a blackhole holds it anyway.
        let wake_at = match due {
            Some(Some(d)) if passing && d > now => Some(d),
            _ => None,
        };
        if may_write && queue.front().is_some_and(|c| c.bytes.is_empty()) {
            return to.shutdown().await;
        }
        tokio::select! {
            r = from.read(&mut buf), if may_read => {
                let n = r?;
                let mut bytes = buf[..n].to_vec();
                if let Some((from, to)) = &*rewrite.borrow() {
                    replace_all(&mut bytes, from, to);
                }
                queue.push_back(Delayed {
                    read_at: Instant::now(),
                    bytes,
                    sent: 0,
                });
                read_eof = n == 0;
            }
            r = write_head(&mut to, &mut queue), if may_write => r?,
            _ = tokio::time::sleep_until(wake_at.unwrap_or(now)), if wake_at.is_some() => {}
            r = mode.changed() => r.map_err(|_| stopped())?,
            r = delay.changed() => r.map_err(|_| stopped())?,
        }
    }
}

/// Replaces every `from` in `bytes` with `to`, of the same length.
fn replace_all(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    let mut at = 0;
    while at + from.len() <= bytes.len() {
        if bytes[at..].starts_with(from) {
            bytes[at..at + to.len()].copy_from_slice(to);
            at += from.len();
        } else {
            at += 1;
        }
    }
}

/// Writes what it can of the queue's head (which must hold bytes) to `to`,
/// and drops the head once it is all written. Cancel-safe.
async fn write_head(to: &mut WriteHalf<'_>, queue: &mut VecDeque<Delayed>) -> io::Result<()> {
    let Some(head) = queue.front_mut() else {
        return Ok(());
    };
    match to.write(&head.bytes[head.sent..]).await? {
        0 => return Err(io::ErrorKind::WriteZero.into()),
        k => head.sent += k,
    }
    if head.sent == head.bytes.len() {
        queue.pop_front();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::replace_all;

    #[test]
    fn every_occurrence_is_replaced_and_nothing_else() {
        let mut bytes = b"granted granted_unbounded grante".to_vec();
        replace_all(&mut bytes, b"granted", b"GRANTED");
        assert_eq!(bytes, b"GRANTED GRANTED_unbounded grante");
        let mut overlapping = b"aaaa".to_vec();
        replace_all(&mut overlapping, b"aa", b"ba");
        assert_eq!(overlapping, b"baba");
    }
}

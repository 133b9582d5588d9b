//! A small SPDY/3.1 client for the runtime's streaming server: Kubernetes'
//! remote command protocol (`v4.channel.k8s.io`) as kubectl speaks it,
//! one SPDY stream per standard stream.
//!
//! Why SPDY and not the runtime's WebSocket: `v4.channel.k8s.io` over
//! WebSocket has no way to say "no more input" short of closing the whole
//! connection (the close signal came with `v5`, Kubernetes 1.29, which
//! containerd 1.6's streaming server predates). Over SPDY every standard
//! stream is its own SPDY stream, and a DATA frame with FIN on stdin's is
//! the end of the command's input.
//!
//! What the server is: Go's `moby/spdystream` under
//! `k8s.io/apimachinery`'s `httpstream/spdy`. It has no flow control
//! (WINDOW_UPDATE and SETTINGS are ignored, none are sent), echoes PINGs
//! and may send its own, and answers each stream the client creates with
//! a SYN_REPLY (data sent before it would be dropped, so the client waits
//! for every reply). Its zlib reader takes a header block compressed
//! without the SPDY dictionary (no FDICT in the zlib header), so this
//! client compresses its own blocks plainly; it never reads the server's
//! header blocks (it needs nothing in them), and since the zlib context
//! is continuous per direction, it decodes none rather than some.
//!
//! - `frame`: the framing, no I/O ([`Frame`], [`decode`],
//!   [`Frame::encode`]), and the client's header blocks ([`HeaderCompressor`]).
//! - [`connect`]: the HTTP upgrade and the streams, then a
//!   [`SpdyReader`] and a [`SpdyWriter`] speaking in channels
//!   ([`apis::streams::channel`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use apis::streams::channel;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tracing::{Instrument, debug, info_span};

mod frame;

use frame::*;
pub use frame::{Frame, HeaderCompressor, MAX_FRAME, PROTOCOL, SpdyError, decode};

/// Which standard streams the command has (as its CRI request said).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Input.
    pub stdin: bool,
    /// Output.
    pub stdout: bool,
    /// Errors (asked for; no stream with a terminal, whose output holds them).
    pub stderr: bool,
    /// A terminal: a resize stream.
    pub tty: bool,
}

/// The SPDY streams of one remote command, by channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamIds {
    /// `(channel, stream id, streamtype)`, in the order they are created.
    streams: Vec<(u8, u32, &'static str)>,
}

impl StreamIds {
    /// The streams for `wanted`, with the client's odd ids from 1, in
    /// kubectl's order: error, stdin, stdout, stderr, resize.
    pub fn for_wanted(wanted: Wanted) -> StreamIds {
        let all = [
            (channel::ERROR, true, "error"),
            (channel::STDIN, wanted.stdin, "stdin"),
            (channel::STDOUT, wanted.stdout, "stdout"),
            (channel::STDERR, wanted.stderr && !wanted.tty, "stderr"),
            (channel::RESIZE, wanted.tty, "resize"),
        ];
        let streams = all
            .into_iter()
            .filter(|(_, on, _)| *on)
            .zip((1u32..).step_by(2))
            .map(|((channel, _, name), id)| (channel, id, name))
            .collect();
        StreamIds { streams }
    }

    /// The stream of `channel`.
    pub fn stream(&self, channel: u8) -> Option<u32> {
        self.streams
            .iter()
            .find(|(c, _, _)| *c == channel)
            .map(|(_, id, _)| *id)
    }

    /// The channel of `stream`.
    pub fn channel(&self, stream: u32) -> Option<u8> {
        self.streams
            .iter()
            .find(|(_, id, _)| *id == stream)
            .map(|(c, _, _)| *c)
    }

    fn name(&self, stream: u32) -> &'static str {
        self.streams
            .iter()
            .find(|(_, id, _)| *id == stream)
            .map_or("unknown", |(_, _, name)| name)
    }
}

/// The HTTP request upgrading to SPDY for `path` at `authority`.
fn upgrade_request(authority: &str, path: &str) -> String {
    format!(
        "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {PROTOCOL}\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

/// Checks the server's answer head to the upgrade (without its blank
/// line): 101, and the protocol agreed on.
fn check_answer(head: &str) -> Result<(), SpdyError> {
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let code = status.split(' ').nth(1).unwrap_or_default();
    if code != "101" {
        return Err(SpdyError::Upgrade(status.to_owned()));
    }
    let protocol = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| {
            name.trim()
                .eq_ignore_ascii_case("x-stream-protocol-version")
        })
        .map(|(_, value)| value.trim());
    match protocol {
        Some(PROTOCOL) => Ok(()),
        other => Err(SpdyError::Upgrade(format!(
            "it agreed on protocol {other:?}, not {PROTOCOL}"
        ))),
    }
}

/// Connects to the runtime's streaming server at `url` (`http://host/path`
/// from CRI Exec or Attach), upgrades to SPDY/3.1 with
/// `v4.channel.k8s.io`, creates the streams `wanted` says and waits for
/// the server to take each (all within `limit`).
pub async fn connect(
    url: &str,
    wanted: Wanted,
    limit: Duration,
) -> Result<(SpdyReader, SpdyWriter), SpdyError> {
    let span = info_span!("spdy", url = %url);
    let connected = async {
        let Some((authority, path)) = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once('/'))
        else {
            return Err(SpdyError::Upgrade(format!(
                "a URL this node cannot reach: {url}"
            )));
        };
        let mut tcp = TcpStream::connect(authority).await?;
        let _ = tcp.set_nodelay(true);
        tcp.write_all(upgrade_request(authority, path).as_bytes())
            .await?;
        let mut buffer = BytesMut::with_capacity(4096);
        let head_len = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            if buffer.len() > MAX_HEAD {
                return Err(SpdyError::Upgrade("an answer head too long".to_owned()));
            }
            if tcp.read_buf(&mut buffer).await? == 0 {
                return Err(SpdyError::Upgrade("no answer".to_owned()));
            }
        };
        let head = buffer.split_to(head_len + 4);
        check_answer(&String::from_utf8_lossy(&head[..head_len]))?;
        let ids = StreamIds::for_wanted(wanted);
        let (read, write) = tcp.into_split();
        let writer = SpdyWriter {
            inner: Arc::new(tokio::sync::Mutex::new(WriterState {
                io: write,
                compressor: HeaderCompressor::default(),
                ended: Vec::new(),
            })),
            ids: ids.clone(),
        };
        writer.create_streams().await?;
        let mut reader = SpdyReader {
            io: read,
            buffer,
            writer: writer.clone(),
            ids,
            pending: VecDeque::new(),
            status: Vec::new(),
            status_sent: false,
            done: false,
        };
        reader.await_replies().await?;
        debug!("streams set up");
        Ok((reader, writer))
    };
    tokio::time::timeout(limit, connected.instrument(span))
        .await
        .unwrap_or(Err(SpdyError::Timeout(limit)))
}

struct WriterState {
    io: OwnedWriteHalf,
    compressor: HeaderCompressor,
    /// The streams this side has ended (FIN sent).
    ended: Vec<u32>,
}

/// The client's side of the session: what goes to the runtime, by
/// channel (stdin, resize). Cloned handles share the connection.
#[derive(Clone)]
pub struct SpdyWriter {
    inner: Arc<tokio::sync::Mutex<WriterState>>,
    ids: StreamIds,
}

impl SpdyWriter {
    async fn create_streams(&self) -> Result<(), SpdyError> {
        let mut state = self.inner.lock().await;
        let mut out = BytesMut::new();
        for (_, stream, name) in &self.ids.streams {
            let block = state.compressor.block(&[("streamtype", name)])?;
            Frame::SynStream {
                stream: *stream,
                fin: false,
                block,
            }
            .encode(&mut out);
        }
        state.io.write_all(&out).await?;
        Ok(())
    }

    async fn write(&self, frames: &[Frame]) -> Result<(), SpdyError> {
        let mut out = BytesMut::new();
        for frame in frames {
            frame.encode(&mut out);
        }
        let mut state = self.inner.lock().await;
        state.io.write_all(&out).await?;
        Ok(())
    }

    /// Sends `bytes` on `channel`'s stream (stdin, resize); nothing for a
    /// channel the command does not have, or has ended.
    pub async fn send(&self, channel: u8, bytes: Bytes) -> Result<(), SpdyError> {
        self.send_data(channel, bytes, false).await
    }

    /// Sends `bytes` on `channel` as its last: its stream ends with them
    /// (FIN on the last frame), so the runtime reads the data and its end
    /// together. A separate end, arriving as the command exits on the
    /// data, can sit unread when the runtime closes the connection, and
    /// its kernel then resets it, the outcome not yet sent with it.
    pub async fn send_last(&self, channel: u8, bytes: Bytes) -> Result<(), SpdyError> {
        self.send_data(channel, bytes, true).await
    }

    async fn send_data(&self, channel: u8, bytes: Bytes, last: bool) -> Result<(), SpdyError> {
        let Some(stream) = self.ids.stream(channel) else {
            return Ok(());
        };
        if !matches!(channel, channel::STDIN | channel::RESIZE) || (bytes.is_empty() && !last) {
            return Ok(());
        }
        let mut out = BytesMut::with_capacity(bytes.len() + 16);
        let mut rest = bytes;
        loop {
            let data = rest.split_to(rest.len().min(MAX_DATA_OUT));
            let fin = last && rest.is_empty();
            Frame::Data { stream, fin, data }.encode(&mut out);
            if rest.is_empty() {
                break;
            }
        }
        let mut state = self.inner.lock().await;
        if state.ended.contains(&stream) {
            return Ok(());
        }
        if last {
            state.ended.push(stream);
        }
        state.io.write_all(&out).await?;
        Ok(())
    }

    /// Ends `channel`'s stream (stdin's end of file): an empty DATA frame
    /// with FIN, once.
    pub async fn end(&self, channel: u8) -> Result<(), SpdyError> {
        let Some(stream) = self.ids.stream(channel) else {
            return Ok(());
        };
        if !matches!(channel, channel::STDIN | channel::RESIZE) {
            return Ok(());
        }
        let mut state = self.inner.lock().await;
        if state.ended.contains(&stream) {
            return Ok(());
        }
        state.ended.push(stream);
        let mut out = BytesMut::new();
        Frame::Data {
            stream,
            fin: true,
            data: Bytes::new(),
        }
        .encode(&mut out);
        state.io.write_all(&out).await?;
        debug!(stream, "ended");
        Ok(())
    }

    /// Gives up: every stream reset (CANCEL), the session left.
    pub async fn cancel(&self) {
        let frames: Vec<Frame> = self
            .ids
            .streams
            .iter()
            .map(|(_, stream, _)| Frame::RstStream {
                stream: *stream,
                status: CANCEL,
            })
            .collect();
        // A runtime that reads nothing more (its buffer full of stdin) must
        // not hold the caller: bounded; the socket closes as it is dropped.
        let leave = async {
            let _ = self.write(&frames).await;
            let _ = self.inner.lock().await.io.shutdown().await;
        };
        if tokio::time::timeout(CANCEL_PATIENCE, leave).await.is_err() {
            debug!("the runtime took no reset in time; the session is dropped");
        }
    }
}

/// How long resetting the streams may take on giving up.
const CANCEL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// The runtime's side of the session, by channel: stdout and stderr as
/// they come, the error stream's outcome (a `metav1.Status` as JSON)
/// whole, once; PINGs answered on the way.
pub struct SpdyReader {
    io: OwnedReadHalf,
    buffer: BytesMut,
    writer: SpdyWriter,
    ids: StreamIds,
    /// DATA read while the streams were set up.
    pending: VecDeque<Frame>,
    /// The error stream's bytes so far.
    status: Vec<u8>,
    status_sent: bool,
    done: bool,
}

impl SpdyReader {
    /// The next frame from the server; `None` at the connection's end
    /// between frames.
    async fn frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        loop {
            if let Some(frame) = decode(&mut self.buffer)? {
                return Ok(Some(frame));
            }
            // Room for the frame under way (its length already checked
            // against MAX_FRAME by decode), or for a header and more.
            let wanted = frame_len(&self.buffer).unwrap_or(8);
            self.buffer
                .reserve(wanted.saturating_sub(self.buffer.len()).max(16 * 1024));
            if self.io.read_buf(&mut self.buffer).await? == 0 {
                return match self.buffer.is_empty() {
                    true => Ok(None),
                    false => Err(SpdyError::Cut),
                };
            }
        }
    }

    /// Reads until the server has answered every stream this client
    /// created.
    async fn await_replies(&mut self) -> Result<(), SpdyError> {
        let mut waiting: Vec<u32> = self.ids.streams.iter().map(|(_, id, _)| *id).collect();
        while !waiting.is_empty() {
            match self.frame().await? {
                Some(Frame::SynReply { stream, .. }) => waiting.retain(|id| *id != stream),
                Some(Frame::RstStream { stream, status }) if waiting.contains(&stream) => {
                    return Err(SpdyError::Refused(self.ids.name(stream), status));
                }
                Some(Frame::Ping { id }) => self.echo(id),
                Some(Frame::GoAway { .. }) | None => return Err(SpdyError::GoneAway),
                Some(frame @ Frame::Data { .. }) => self.pending.push_back(frame),
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Echoes the server's PING `id`, from a task of its own: the writer
    /// may be waiting on a full connection (stdin the command does not
    /// read), and the reader must go on reading meanwhile.
    fn echo(&self, id: u32) {
        let writer = self.writer.clone();
        tokio::spawn(
            async move {
                if let Err(err) = writer.write(&[Frame::Ping { id }]).await {
                    debug!(error = %err, "a PING not echoed");
                }
            }
            .in_current_span(),
        );
    }

    /// The outcome, once, if the error stream said anything.
    fn take_status(&mut self) -> Option<(u8, Bytes)> {
        if self.status_sent || self.status.is_empty() {
            return None;
        }
        self.status_sent = true;
        Some((channel::ERROR, std::mem::take(&mut self.status).into()))
    }

    /// The next bytes from the runtime, with their channel; `None` once
    /// the session ended (the server's GOAWAY, or its end of the
    /// connection). The error stream's bytes come whole, once, when it
    /// ends.
    pub async fn next(&mut self) -> Result<Option<(u8, Bytes)>, SpdyError> {
        loop {
            if self.done {
                return Ok(self.take_status());
            }
            let frame = match self.pending.pop_front() {
                Some(frame) => Some(frame),
                None => match self.frame().await {
                    Ok(frame) => frame,
                    // The runtime closes the connection once the outcome
                    // is written; with input of ours still unread there
                    // (the end of stdin, sent as the command exited) its
                    // kernel resets the connection, which may come before
                    // the outcome's stream end: the outcome read so far
                    // is the outcome.
                    Err(err) => {
                        self.done = true;
                        match self.take_status() {
                            Some(status) => {
                                debug!(error = %err, "the runtime's connection ended after its outcome");
                                return Ok(Some(status));
                            }
                            None => return Err(err),
                        }
                    }
                },
            };
            match frame {
                Some(Frame::Data { stream, fin, data }) => {
                    let channel = self.ids.channel(stream);
                    if channel == Some(channel::ERROR) {
                        let room = MAX_STATUS.saturating_sub(self.status.len());
                        self.status.extend_from_slice(&data[..data.len().min(room)]);
                        if fin && let Some(status) = self.take_status() {
                            return Ok(Some(status));
                        }
                    } else if let Some(channel @ (channel::STDOUT | channel::STDERR)) = channel
                        && !data.is_empty()
                    {
                        return Ok(Some((channel, data)));
                    }
                }
                Some(Frame::RstStream { stream, .. })
                    if self.ids.channel(stream) == Some(channel::ERROR) =>
                {
                    if let Some(status) = self.take_status() {
                        return Ok(Some(status));
                    }
                }
                Some(Frame::Ping { id }) => self.echo(id),
                Some(Frame::GoAway { .. }) | None => self.done = true,
                // Replies, settings, window updates, headers: nothing to
                // act on (no flow control on either side).
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;

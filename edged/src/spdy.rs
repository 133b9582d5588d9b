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
mod tests {
    use super::*;
    use bytes::Buf;

    fn encoded(frames: &[Frame]) -> BytesMut {
        let mut out = BytesMut::new();
        for frame in frames {
            frame.encode(&mut out);
        }
        out
    }

    #[test]
    fn frames_read_back_as_written() {
        let frames = [
            Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::new(),
            },
            Frame::SynStream {
                stream: 1,
                fin: false,
                block: Bytes::from_static(b"\x78\x9c..."),
            },
            Frame::SynReply {
                stream: 1,
                fin: false,
                block: Bytes::from_static(b"xyz"),
            },
            Frame::RstStream {
                stream: 5,
                status: CANCEL,
            },
            Frame::Settings { entries: 0 },
            Frame::Ping { id: 2 },
            Frame::GoAway {
                last_good: 7,
                status: 0,
            },
            Frame::Headers {
                stream: 9,
                fin: true,
                block: Bytes::from_static(b"abc"),
            },
            Frame::WindowUpdate {
                stream: 3,
                delta: 65536,
            },
        ];
        let mut buffer = encoded(&frames);
        for frame in frames {
            assert_eq!(decode(&mut buffer).ok().flatten(), Some(frame));
        }
        assert!(buffer.is_empty());
        assert!(matches!(decode(&mut buffer), Ok(None)));
    }

    #[test]
    fn the_wire_format_is_spdy_3() {
        let out = encoded(&[Frame::Data {
            stream: 3,
            fin: true,
            data: Bytes::from_static(b"ab"),
        }]);
        assert_eq!(&out[..], &[0, 0, 0, 3, 1, 0, 0, 2, b'a', b'b']);
        let out = encoded(&[Frame::Ping { id: 1 }]);
        assert_eq!(&out[..], &[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
        let out = encoded(&[Frame::SynStream {
            stream: 1,
            fin: false,
            block: Bytes::from_static(b"B"),
        }]);
        assert_eq!(
            &out[..],
            &[
                0x80, 3, 0, 1, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, b'B'
            ]
        );
    }

    #[test]
    fn a_cut_frame_waits_for_the_rest() {
        let whole = encoded(&[Frame::Data {
            stream: 1,
            fin: false,
            data: Bytes::from(vec![7u8; 100]),
        }]);
        for cut in [0, 3, 8, 50, whole.len() - 1] {
            let mut buffer = BytesMut::from(&whole[..cut]);
            assert!(matches!(decode(&mut buffer), Ok(None)), "cut at {cut}");
            assert_eq!(buffer.len(), cut, "nothing taken while cut");
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header() {
        // A DATA frame saying 16 MiB - 1, only its header there.
        let mut buffer = BytesMut::from(&[0u8, 0, 0, 1, 0, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            decode(&mut buffer),
            Err(SpdyError::TooLong(0xff_ffff))
        ));
        let mut buffer = BytesMut::from(&[0x80u8, 3, 0, 2, 0, 0x10, 0, 1][..]);
        assert!(matches!(decode(&mut buffer), Err(SpdyError::TooLong(_))));
    }

    #[test]
    fn garbled_frames_are_errors_not_panics() {
        let garbled: [&[u8]; 7] = [
            // Data on stream 0.
            &[0, 0, 0, 0, 0, 0, 0, 1, 9],
            // SPDY/2.
            &[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1],
            // A PING of 3 bytes.
            &[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 1],
            // A RST_STREAM of 4 bytes.
            &[0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1],
            // A SYN_STREAM shorter than its fixed part.
            &[0x80, 3, 0, 1, 0, 0, 0, 2, 0, 1],
            // SETTINGS saying 2 entries, carrying 1.
            &[
                0x80, 3, 0, 4, 0, 0, 0, 12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1,
            ],
            // A GOAWAY of 9 bytes.
            &[0x80, 3, 0, 7, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ];
        for bytes in garbled {
            let mut buffer = BytesMut::from(bytes);
            assert!(
                matches!(decode(&mut buffer), Err(SpdyError::Garbled(_))),
                "{bytes:?}"
            );
        }
        // A SYN_REPLY with no room for its stream id.
        let mut buffer = BytesMut::from(&[0x80u8, 3, 0, 2, 0, 0, 0, 2, 0, 1][..]);
        assert!(matches!(decode(&mut buffer), Err(SpdyError::Garbled(_))));
        // A control type SPDY/3 does not have is read (and ignored).
        let mut buffer = BytesMut::from(&[0x80u8, 3, 0, 42, 0, 0, 0, 1, 0][..]);
        assert_eq!(
            decode(&mut buffer).ok().flatten(),
            Some(Frame::Unknown { kind: 42 })
        );
    }

    /// Reads one name/value block back.
    fn headers_of(plain: &[u8]) -> Vec<(String, String)> {
        let mut buf = plain;
        let count = buf.get_u32();
        (0..count)
            .map(|_| {
                let len = buf.get_u32() as usize;
                let name = String::from_utf8(buf[..len].to_vec()).expect("name");
                buf.advance(len);
                let len = buf.get_u32() as usize;
                let value = String::from_utf8(buf[..len].to_vec()).expect("value");
                buf.advance(len);
                (name, value)
            })
            .collect()
    }

    #[test]
    fn header_blocks_are_one_zlib_stream_without_dictionary() {
        let mut compressor = HeaderCompressor::default();
        let first = compressor
            .block(&[("streamType", "error")])
            .expect("compressed");
        let second = compressor
            .block(&[("streamtype", "stdin")])
            .expect("compressed");
        // A zlib header with no preset dictionary (FDICT, bit 5, clear).
        assert_eq!(first[0] & 0x0f, 8);
        assert_eq!(first[1] & 0x20, 0);
        assert_eq!(((u16::from(first[0]) << 8) | u16::from(first[1])) % 31, 0);
        // Each block decodes on its own, the second in the first's context.
        let mut zlib = flate2::Decompress::new(true);
        let mut read = |block: &[u8]| {
            let mut out = Vec::with_capacity(1024);
            zlib.decompress_vec(block, &mut out, flate2::FlushDecompress::Sync)
                .expect("decompressed");
            headers_of(&out)
        };
        assert_eq!(
            read(&first),
            [("streamtype".to_owned(), "error".to_owned())]
        );
        assert_eq!(
            read(&second),
            [("streamtype".to_owned(), "stdin".to_owned())]
        );
    }

    #[test]
    fn streams_are_created_as_kubectl_does() {
        let exec = StreamIds::for_wanted(Wanted {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        });
        assert_eq!(
            exec.streams,
            [
                (channel::ERROR, 1, "error"),
                (channel::STDIN, 3, "stdin"),
                (channel::STDOUT, 5, "stdout"),
                (channel::STDERR, 7, "stderr"),
            ]
        );
        let terminal = StreamIds::for_wanted(Wanted {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: true,
        });
        assert_eq!(
            terminal.streams,
            [
                (channel::ERROR, 1, "error"),
                (channel::STDIN, 3, "stdin"),
                (channel::STDOUT, 5, "stdout"),
                (channel::RESIZE, 7, "resize"),
            ]
        );
        assert_eq!(terminal.stream(channel::STDERR), None);
        assert_eq!(terminal.channel(5), Some(channel::STDOUT));
    }

    /// The next frame a fake server reads from `tcp`.
    async fn server_reads(tcp: &mut TcpStream, buffer: &mut BytesMut) -> Frame {
        loop {
            if let Some(frame) = decode(buffer).expect("a frame") {
                return frame;
            }
            assert_ne!(tcp.read_buf(buffer).await.expect("read"), 0, "cut");
        }
    }

    /// A session against a fake server speaking as spdystream does: it
    /// pings first, answers each stream, reads stdin to its FIN, then
    /// writes stdout and the outcome (in two pieces) and goes away.
    #[tokio::test]
    async fn a_session_carries_stdin_to_its_end_and_the_outcome_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let address = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("accepted");
            let mut buffer = BytesMut::new();
            while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
                tcp.read_buf(&mut buffer).await.expect("head");
            }
            let head = String::from_utf8_lossy(&buffer).into_owned();
            assert!(head.starts_with("POST /exec/token HTTP/1.1\r\n"), "{head}");
            assert!(head.contains("Upgrade: SPDY/3.1\r\n"), "{head}");
            buffer.clear();
            let mut out = BytesMut::from(
                &b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                   Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"[..],
            );
            Frame::Ping { id: 2 }.encode(&mut out);
            tcp.write_all(&out).await.expect("answer");
            let mut zlib = flate2::Decompress::new(true);
            let mut types = Vec::new();
            let mut stdin = Vec::new();
            let mut pinged = false;
            loop {
                match server_reads(&mut tcp, &mut buffer).await {
                    Frame::SynStream { stream, block, .. } => {
                        let mut plain = Vec::with_capacity(1024);
                        zlib.decompress_vec(&block, &mut plain, flate2::FlushDecompress::Sync)
                            .expect("headers");
                        types.push((stream, headers_of(&plain)[0].1.clone()));
                        let mut reply = BytesMut::new();
                        Frame::SynReply {
                            stream,
                            fin: false,
                            block: Bytes::new(),
                        }
                        .encode(&mut reply);
                        tcp.write_all(&reply).await.expect("reply");
                    }
                    Frame::Ping { id } => pinged = id == 2,
                    Frame::Data {
                        stream: 3,
                        fin,
                        data,
                    } => {
                        stdin.extend_from_slice(&data);
                        if fin {
                            break;
                        }
                    }
                    other => panic!("the client sent {other:?}"),
                }
            }
            let status = br#"{"kind":"Status","status":"Success"}"#;
            let mut out = BytesMut::new();
            for frame in [
                Frame::Data {
                    stream: 5,
                    fin: false,
                    data: Bytes::from_static(b"out"),
                },
                Frame::Data {
                    stream: 1,
                    fin: false,
                    data: Bytes::copy_from_slice(&status[..10]),
                },
                Frame::Data {
                    stream: 1,
                    fin: true,
                    data: Bytes::copy_from_slice(&status[10..]),
                },
                Frame::RstStream {
                    stream: 5,
                    status: CANCEL,
                },
                Frame::GoAway {
                    last_good: 0,
                    status: 0,
                },
            ] {
                frame.encode(&mut out);
            }
            tcp.write_all(&out).await.expect("output");
            (types, stdin, pinged)
        });
        let url = format!("http://{address}/exec/token");
        let wanted = Wanted {
            stdin: true,
            stdout: true,
            ..Wanted::default()
        };
        let (mut reader, writer) = connect(&url, wanted, Duration::from_secs(10))
            .await
            .expect("connected");
        let input = Bytes::from(vec![b'x'; 100_000]);
        writer.send(channel::STDIN, input).await.expect("stdin");
        writer.end(channel::STDIN).await.expect("stdin's end");
        writer
            .end(channel::STDIN)
            .await
            .expect("a second end sends nothing");
        let mut got = Vec::new();
        while let Some(chunk) = reader.next().await.expect("read") {
            got.push(chunk);
        }
        assert_eq!(
            got,
            [
                (channel::STDOUT, Bytes::from_static(b"out")),
                (
                    channel::ERROR,
                    Bytes::from_static(br#"{"kind":"Status","status":"Success"}"#)
                ),
            ]
        );
        let (types, stdin, pinged) = server.await.expect("server");
        assert_eq!(
            types,
            [
                (1, "error".to_owned()),
                (3, "stdin".to_owned()),
                (5, "stdout".to_owned())
            ]
        );
        assert_eq!(stdin.len(), 100_000);
        assert!(pinged, "the server's PING echoed");
    }

    #[test]
    fn the_answer_must_be_101_with_v4() {
        let good = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                    Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io";
        assert!(check_answer(good).is_ok());
        assert!(check_answer("HTTP/1.1 404 Not Found\r\nContent-Length: 0").is_err());
        let other =
            "HTTP/1.1 101 Switching Protocols\r\nX-Stream-Protocol-Version: v3.channel.k8s.io";
        assert!(check_answer(other).is_err());
        assert!(check_answer("").is_err());
        let request = upgrade_request("127.0.0.1:1234", "exec/abc");
        assert!(request.starts_with("POST /exec/abc HTTP/1.1\r\nHost: 127.0.0.1:1234\r\n"));
        assert!(request.ends_with("\r\n\r\n"));
    }
}

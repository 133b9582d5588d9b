//! Go's gRPC clients, as KubeEdge's mapper-framework and edgecore dial a
//! Unix socket by its path, send that path as each request's `:authority`
//! (`/etc/kubeedge/dmi.sock`); so do grpc-java and grpc-core. h2, the
//! HTTP/2 layer under tonic, refuses such a request as malformed and resets
//! its stream (hyperium/h2#487), so no KubeEdge mapper could call an
//! edgehive edge, and no KubeEdge edgecore an edgehive mapper.
//!
//! [`LenientAuthority`] sits between a Unix socket and tonic's server: it
//! reads the client's HTTP/2 frames, and in each request's header block
//! puts `localhost` (what Kubernetes' and tonic's own clients send on a
//! Unix socket) in place of an authority that is not one. Header blocks are
//! decoded with the client's HPACK context and written again as literals
//! without indexing, so the server's decoder never needs a table; every
//! other frame passes unchanged, and nothing is buffered beyond the frame
//! being read. What the server writes goes back untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

/// The client's connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's header: length (24 bits), type, flags, stream.
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame a peer may send before the server raises it.
const MAX_FRAME: usize = 16_384;
/// A header block (with its continuations) larger than this ends the
/// connection.
const MAX_BLOCK: usize = 64 * 1024;
/// Decoded header fields (names, values and 32 octets each, as RFC 7541
/// counts them) beyond this end the connection: a small block of indexed
/// references may decode to much more (h2 would have refused them by its
/// own list limit, which it no longer sees).
const MAX_HEADER_LIST: usize = 64 * 1024;
/// The dynamic table a client may ask for: the 4096 octets a server has
/// when it advertises nothing else (tonic advertises nothing else).
const MAX_TABLE: usize = 4096;
/// What a refused authority becomes.
const LOCALHOST: &[u8] = b"localhost";

/// A Unix socket connection whose requests' authorities are made ones h2
/// takes.
pub struct LenientAuthority {
    inner: UnixStream,
    rewriter: Rewriter,
    /// Bytes read from the socket, not yet a whole frame.
    input: BytesMut,
    /// Bytes ready for the server.
    output: BytesMut,
    eof: bool,
}

impl LenientAuthority {
    /// Wraps a connection accepted on a Unix socket.
    pub fn new(inner: UnixStream) -> LenientAuthority {
        LenientAuthority {
            inner,
            rewriter: Rewriter::default(),
            input: BytesMut::with_capacity(8192),
            output: BytesMut::with_capacity(8192),
            eof: false,
        }
    }
}

impl AsyncRead for LenientAuthority {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // What is left of a frame goes as it is; h2 sees it cut.
                    this.output.extend_from_slice(&this.input.split());
                    this.eof = true;
                }
                Poll::Ready(Ok(())) => {
                    this.input.extend_from_slice(read.filled());
                    this.rewriter
                        .take(&mut this.input, &mut this.output)
                        .map_err(|reason| io::Error::new(io::ErrorKind::InvalidData, reason))?;
                }
            }
        }
    }
}

impl AsyncWrite for LenientAuthority {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for LenientAuthority {
    type ConnectInfo = <UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// What the server is given for a client's bytes, read as `reads` (each
/// one socket read), or why the connection ends: the rewriting alone,
/// without a socket (the fuzz target's entry).
pub fn rewrite_reads<'a>(reads: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>, String> {
    let mut rewriter = Rewriter::default();
    let (mut input, mut output) = (BytesMut::new(), BytesMut::new());
    for read in reads {
        input.extend_from_slice(read);
        rewriter.take(&mut input, &mut output)?;
    }
    Ok(output.to_vec())
}

/// The client-to-server byte stream's rewriting, as plain code: whole
/// frames in, frames out.
#[derive(Default)]
struct Rewriter {
    preface_seen: bool,
    /// Not HTTP/2 with prior knowledge: everything passes as it is, for h2
    /// to refuse.
    passthrough: bool,
    decoder: HpackDecoder,
    /// A header block waiting for its continuations.
    pending: Option<PendingBlock>,
}

/// A HEADERS frame's stream, flags and priority fields, and its block so
/// far.
struct PendingBlock {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// The client's HPACK context.
struct HpackDecoder(loona_hpack::Decoder<'static>);

impl Default for HpackDecoder {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        HpackDecoder(decoder)
    }
}

impl Rewriter {
    /// Moves every whole frame in `input` to `output`, header blocks
    /// rewritten.
    fn take(&mut self, input: &mut BytesMut, output: &mut BytesMut) -> Result<(), String> {
        if self.passthrough {
            output.extend_from_slice(&input.split());
            return Ok(());
        }
        if !self.preface_seen {
            let seen = input.len().min(PREFACE.len());
            if input[..seen] != PREFACE[..seen] {
                // Not HTTP/2 with prior knowledge: h2 says so itself.
                self.passthrough = true;
                output.extend_from_slice(&input.split());
                return Ok(());
            }
            if seen < PREFACE.len() {
                return Ok(());
            }
            output.extend_from_slice(&input.split_to(PREFACE.len()));
            self.preface_seen = true;
        }
        while input.len() >= FRAME_HEADER {
            let length = (usize::from(input[0]) << 16)
                | (usize::from(input[1]) << 8)
                | usize::from(input[2]);
            if length > MAX_BLOCK {
                return Err(format!("an HTTP/2 frame of {length} bytes"));
            }
            if input.len() < FRAME_HEADER + length {
                return Ok(());
            }
            let frame = input.split_to(FRAME_HEADER + length);
            let (kind, flags) = (frame[3], frame[4]);
            let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
            let payload = &frame[FRAME_HEADER..];
            match (kind, &mut self.pending) {
                (HEADERS, None) => {
                    let (priority, fragment) = headers_fragment(flags, payload)?;
                    if flags & END_HEADERS != 0 {
                        self.rewrite(stream, flags, priority, fragment, output)?;
                    } else {
                        self.pending = Some(PendingBlock {
                            stream,
                            flags,
                            priority,
                            block: fragment.to_vec(),
                        });
                    }
                }
                (CONTINUATION, Some(pending)) if pending.stream == stream => {
                    pending.block.extend_from_slice(payload);
                    if pending.block.len() > MAX_BLOCK {
                        return Err(format!("a header block over {MAX_BLOCK} bytes"));
                    }
                    if flags & END_HEADERS != 0
                        && let Some(done) = self.pending.take()
                    {
                        self.rewrite(done.stream, done.flags, done.priority, &done.block, output)?;
                    }
                }
                (PUSH_PROMISE, _) => return Err("a client sent PUSH_PROMISE".to_owned()),
                (_, Some(_)) => {
                    return Err("a frame between a header block and its continuation".to_owned());
                }
                (_, None) => output.extend_from_slice(&frame),
            }
        }
        Ok(())
    }

    /// Decodes a whole header block and writes it again as HEADERS (and
    /// CONTINUATION) frames, an authority that is not one made `localhost`.
    fn rewrite(
        &mut self,
        stream: u32,
        flags: u8,
        priority: Option<[u8; 5]>,
        block: &[u8],
        output: &mut BytesMut,
    ) -> Result<(), String> {
        let mut encoded = Vec::with_capacity(block.len() + 32);
        let mut listed = 0usize;
        let decoded = self.decoder.0.decode_with_cb(block, |name, value| {
            listed = listed.saturating_add(name.len() + value.len() + 32);
            if listed > MAX_HEADER_LIST {
                return;
            }
            let value: &[u8] = if &*name == b":authority" && !is_authority(&value) {
                LOCALHOST
            } else {
                &value
            };
            literal(&mut encoded, &name, value);
        });
        decoded.map_err(|err| format!("an HPACK block that does not decode: {err:?}"))?;
        if listed > MAX_HEADER_LIST {
            return Err(format!(
                "a header list of {listed} octets (at most {MAX_HEADER_LIST})"
            ));
        }
        let mut fragments = encoded.chunks(MAX_FRAME - 5).peekable();
        let first = fragments.next().unwrap_or_default();
        let last_first = fragments.peek().is_none();
        let mut first_flags = flags & !(PADDED | END_HEADERS);
        if last_first {
            first_flags |= END_HEADERS;
        }
        let mut payload = Vec::with_capacity(first.len() + 5);
        if let Some(priority) = priority {
            payload.extend_from_slice(&priority);
        }
        payload.extend_from_slice(first);
        frame(output, HEADERS, first_flags, stream, &payload);
        while let Some(fragment) = fragments.next() {
            let flags = if fragments.peek().is_none() {
                END_HEADERS
            } else {
                0
            };
            frame(output, CONTINUATION, flags, stream, fragment);
        }
        Ok(())
    }
}

/// A HEADERS frame's priority fields (if flagged) and its block fragment,
/// its padding left off.
fn headers_fragment(flags: u8, payload: &[u8]) -> Result<(Option<[u8; 5]>, &[u8]), String> {
    let mut rest = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&length, after) = rest
            .split_first()
            .ok_or("a padded HEADERS frame without its length")?;
        padding = usize::from(length);
        rest = after;
    }
    let priority = if flags & PRIORITY != 0 {
        let fields: [u8; 5] = rest
            .get(..5)
            .and_then(|p| p.try_into().ok())
            .ok_or("a HEADERS frame's priority cut short")?;
        rest = &rest[5..];
        Some(fields)
    } else {
        None
    };
    let end = rest
        .len()
        .checked_sub(padding)
        .ok_or("a HEADERS frame's padding longer than the frame")?;
    Ok((priority, &rest[..end]))
}

/// Whether h2 takes `value` as a request's authority.
fn is_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A header field as a literal without indexing, its name a literal too
/// (RFC 7541 6.2.2), no Huffman coding.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    string(out, name);
    string(out, value);
}

/// A string literal: its length as a 7-bit-prefix integer, then its bytes.
fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    integer(out, 0x00, 7, bytes.len());
    out.extend_from_slice(bytes);
}

/// An HPACK integer with an `n`-bit prefix after `first`'s high bits.
fn integer(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value % 0x80) as u8 | 0x80);
        value /= 0x80;
    }
    out.push(value as u8);
}

fn frame(out: &mut BytesMut, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let length = payload.len();
    out.reserve(FRAME_HEADER + length);
    out.put_u8((length >> 16) as u8);
    out.put_u8((length >> 8) as u8);
    out.put_u8(length as u8);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
    out.put_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(flags: u8, stream: u32, block: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        frame(&mut out, HEADERS, flags, stream, block);
        out
    }

    /// The fields of the header blocks in `bytes` (frames after the
    /// preface), decoded afresh as the server would.
    fn decoded(bytes: &[u8]) -> Vec<(String, String)> {
        let mut decoder = loona_hpack::Decoder::new();
        let mut rest = &bytes[PREFACE.len()..];
        let mut block = Vec::new();
        let mut fields = Vec::new();
        while rest.len() >= FRAME_HEADER {
            let length =
                (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let payload = &rest[FRAME_HEADER..FRAME_HEADER + length];
            if kind == HEADERS || kind == CONTINUATION {
                let skip = if kind == HEADERS && flags & PRIORITY != 0 {
                    5
                } else {
                    0
                };
                block.extend_from_slice(&payload[skip..]);
                if flags & END_HEADERS != 0 {
                    for (n, v) in decoder.decode(&block).expect("decodes") {
                        fields.push((
                            String::from_utf8_lossy(&n).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        ));
                    }
                    block.clear();
                }
            }
            rest = &rest[FRAME_HEADER + length..];
        }
        fields
    }

    fn request(authority: &str) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method".as_slice(), b"POST".to_vec()),
            (b":scheme".as_slice(), b"http".to_vec()),
            (
                b":path".as_slice(),
                b"/v1beta1.DeviceManagerService/MapperRegister".to_vec(),
            ),
            (b":authority".as_slice(), authority.as_bytes().to_vec()),
            (b"content-type".as_slice(), b"application/grpc".to_vec()),
        ]
    }

    #[test]
    fn a_socket_path_as_authority_becomes_localhost_and_the_rest_stands() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = BytesMut::from(PREFACE);
        // SETTINGS, then two requests: the second's fields come from the
        // client's dynamic table, the third's block in three frames with
        // padding and priority on the first.
        frame(&mut input, 0x4, 0, 0, &[]);
        let first = encoder.encode(
            request("/etc/kubeedge/dmi.sock")
                .iter()
                .map(|(n, v)| (*n, v.as_slice())),
        );
        input.extend_from_slice(&headers_frame(END_HEADERS, 1, &first));
        frame(&mut input, 0x0, 0x1, 1, b"\0\0\0\0\0");
        let second = encoder.encode(
            request("/etc/kubeedge/dmi.sock")
                .iter()
                .map(|(n, v)| (*n, v.as_slice())),
        );
        input.extend_from_slice(&headers_frame(END_HEADERS, 3, &second));
        let third = encoder.encode(
            request("localhost:50051")
                .iter()
                .map(|(n, v)| (*n, v.as_slice())),
        );
        let mut padded = vec![2u8];
        padded.extend_from_slice(&[0, 0, 0, 0, 16]);
        padded.extend_from_slice(&third[..4]);
        padded.extend_from_slice(&[0, 0]);
        input.extend_from_slice(&headers_frame(PADDED | PRIORITY, 5, &padded));
        frame(&mut input, CONTINUATION, 0, 5, &third[4..8]);
        frame(&mut input, CONTINUATION, END_HEADERS, 5, &third[8..]);

        // Fed a few bytes at a time, as a socket may give them.
        let mut rewriter = Rewriter::default();
        let (mut pending, mut output) = (BytesMut::new(), BytesMut::new());
        for chunk in input.chunks(7) {
            pending.extend_from_slice(chunk);
            rewriter.take(&mut pending, &mut output).expect("rewritten");
        }
        assert!(pending.is_empty());
        let fields = decoded(&output);
        let authorities: Vec<&str> = fields
            .iter()
            .filter(|(n, _)| n == ":authority")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(authorities, ["localhost", "localhost", "localhost:50051"]);
        let paths = fields
            .iter()
            .filter(|(n, v)| n == ":path" && v.ends_with("MapperRegister"))
            .count();
        assert_eq!(paths, 3);
        // The DATA frame passed as it was.
        assert!(
            output
                .windows(14)
                .any(|w| w == [0, 0, 5, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0])
        );
    }

    #[test]
    fn what_cannot_be_taken_ends_the_connection() {
        let mut rewriter = Rewriter::default();
        let mut input = BytesMut::from(PREFACE);
        input.extend_from_slice(&headers_frame(END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        let mut output = BytesMut::new();
        assert!(rewriter.take(&mut input, &mut output).is_err());
        // A frame claiming more than the limit is refused before it is read.
        let mut rewriter = Rewriter::default();
        let mut input = BytesMut::from(PREFACE);
        input.extend_from_slice(&[0xff, 0xff, 0xff, HEADERS, 0, 0, 0, 0, 1]);
        assert!(rewriter.take(&mut input, &mut BytesMut::new()).is_err());
        // A size update cut short, or asking for a table over 4096 octets.
        for block in [&[0x3f][..], &[0x3f, 0xe1, 0xff, 0x03][..]] {
            let mut rewriter = Rewriter::default();
            let mut input = BytesMut::from(PREFACE);
            input.extend_from_slice(&headers_frame(END_HEADERS, 1, block));
            assert!(
                rewriter.take(&mut input, &mut BytesMut::new()).is_err(),
                "{block:?}"
            );
        }
        // A small block that decodes to a huge list: a 4 KB field put in the
        // table, then referred to 2,000 times (8 MB).
        let mut rewriter = Rewriter::default();
        let mut input = BytesMut::from(PREFACE);
        let mut block = vec![0x40, 0x01, b'x'];
        integer(&mut block, 0, 7, 4000);
        block.extend(std::iter::repeat_n(b'y', 4000));
        block.extend(std::iter::repeat_n(0xbe, 2000));
        input.extend_from_slice(&headers_frame(END_HEADERS, 1, &block));
        let err = rewriter
            .take(&mut input, &mut BytesMut::new())
            .expect_err("a bomb");
        assert!(err.contains("header list"), "{err}");
        // Not HTTP/2, even a few bytes of it: passed as they are.
        let mut rewriter = Rewriter::default();
        let mut output = BytesMut::new();
        rewriter
            .take(&mut BytesMut::from(&b"GET"[..]), &mut output)
            .expect("passed");
        rewriter
            .take(&mut BytesMut::from(&b" / HTTP/1.1\r\n"[..]), &mut output)
            .expect("passed");
        assert_eq!(&output[..], b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn integers_take_their_continuation_bytes() {
        let mut out = Vec::new();
        integer(&mut out, 0, 7, 126);
        integer(&mut out, 0, 7, 127);
        integer(&mut out, 0, 7, 1337);
        assert_eq!(out, [126, 127, 0, 127, 0xba, 0x09]);
    }
}

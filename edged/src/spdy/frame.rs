//! SPDY/3.1 framing as the runtime's streaming server speaks it, with no
//! I/O: [`Frame`], [`decode`] and [`Frame::encode`], the client's header
//! blocks ([`HeaderCompressor`]), the limits and the error. The client
//! around it is the parent module.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The most payload bytes of one frame this client reads; a longer frame
/// is refused before anything is allocated for it. The server writes
/// what the runtime hands it (32 KiB copies), and a status.
pub const MAX_FRAME: usize = 1 << 20;

/// The most payload bytes of one DATA frame this client sends.
pub(super) const MAX_DATA_OUT: usize = 32 * 1024;

/// The most bytes of the server's HTTP answer to the upgrade.
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// The most bytes of the outcome on the error stream that are kept.
pub(super) const MAX_STATUS: usize = 64 * 1024;

/// SPDY's version in control frames.
pub(super) const VERSION: u16 = 3;

/// The remote command protocol spoken inside SPDY.
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// Control frame types.
pub(super) mod kind {
    pub const SYN_STREAM: u16 = 1;
    pub const SYN_REPLY: u16 = 2;
    pub const RST_STREAM: u16 = 3;
    pub const SETTINGS: u16 = 4;
    pub const PING: u16 = 6;
    pub const GOAWAY: u16 = 7;
    pub const HEADERS: u16 = 8;
    pub const WINDOW_UPDATE: u16 = 9;
}

/// The FIN flag (DATA, SYN_STREAM, SYN_REPLY, HEADERS).
pub(super) const FLAG_FIN: u8 = 0x01;

/// RST_STREAM's CANCEL status.
pub(super) const CANCEL: u32 = 5;

/// What went wrong with the runtime's SPDY session.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    /// A frame longer than [`MAX_FRAME`] (refused unread).
    #[error("a SPDY frame of {0} bytes, more than the {MAX_FRAME} this node takes")]
    TooLong(usize),
    /// A frame that is not SPDY/3 or not of its type's shape.
    #[error("a SPDY frame this node cannot read: {0}")]
    Garbled(&'static str),
    /// The connection ended in the middle of a frame.
    #[error("the runtime's streaming server ended the connection inside a frame")]
    Cut,
    /// The HTTP upgrade to SPDY was not granted.
    #[error("the runtime's streaming server refused SPDY: {0}")]
    Upgrade(String),
    /// The server reset a stream before it was set up.
    #[error("the runtime's streaming server reset the {0} stream (status {1})")]
    Refused(&'static str, u32),
    /// The server went away before the streams were set up.
    #[error("the runtime's streaming server went away while the streams were set up")]
    GoneAway,
    /// The connection (to, from, or connecting to the server).
    #[error("the runtime's streaming server: {0}")]
    Io(#[from] std::io::Error),
    /// The header compressor failed.
    #[error("SPDY header compression: {0}")]
    Compress(#[from] flate2::CompressError),
    /// The server did not answer in time.
    #[error("the runtime's streaming server did not answer within {0:?}")]
    Timeout(Duration),
}

/// One SPDY/3 frame. Header blocks are kept compressed (this client never
/// reads the server's); SYN_STREAM's priority and associated stream are
/// always 0 from this client and not kept from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Bytes on a stream; FIN: the sender's last.
    Data {
        /// The stream.
        stream: u32,
        /// The sender's last on it.
        fin: bool,
        /// The bytes.
        data: Bytes,
    },
    /// A new stream, with its headers.
    SynStream {
        /// The new stream's id.
        stream: u32,
        /// Nothing more comes from its creator.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// The answer to a new stream.
    SynReply {
        /// The stream.
        stream: u32,
        /// Nothing more comes from the answering side.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// A stream ended abruptly.
    RstStream {
        /// The stream.
        stream: u32,
        /// Why.
        status: u32,
    },
    /// Session settings (ignored: the server has no flow control).
    Settings {
        /// How many entries.
        entries: u32,
    },
    /// A ping; the receiver of one it did not send echoes it.
    Ping {
        /// Its id (odd from the client, even from the server).
        id: u32,
    },
    /// The sender opens no more streams and is about to end the session.
    GoAway {
        /// The last stream it took.
        last_good: u32,
        /// Why.
        status: u32,
    },
    /// More headers on a stream.
    Headers {
        /// The stream.
        stream: u32,
        /// Nothing more comes from the sender.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// Flow control credit (ignored, as the server ignores it).
    WindowUpdate {
        /// The stream.
        stream: u32,
        /// The credit.
        delta: u32,
    },
    /// A control frame of a type SPDY/3 does not have (to be ignored).
    Unknown {
        /// Its type.
        kind: u16,
    },
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> Result<u32, SpdyError> {
    bytes
        .get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .ok_or(SpdyError::Garbled("a control frame too short for its type"))
}

/// The whole length of the frame at the front of `buffer` (header and
/// payload), once its header is there.
pub(super) fn frame_len(buffer: &[u8]) -> Option<usize> {
    let head = buffer.get(..8)?;
    Some(8 + ((usize::from(head[5]) << 16) | (usize::from(head[6]) << 8) | usize::from(head[7])))
}

/// The next whole frame at the front of `buffer`, taken off it; `None`
/// while the frame is not all there yet. A frame's length is checked
/// against [`MAX_FRAME`] as soon as its 8-byte header is in.
pub fn decode(buffer: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
    let Some(head) = buffer.get(..8) else {
        return Ok(None);
    };
    let first = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let flags = head[4];
    let length = frame_len(head).unwrap_or(8) - 8;
    if length > MAX_FRAME {
        return Err(SpdyError::TooLong(length));
    }
    if buffer.len() < 8 + length {
        return Ok(None);
    }
    buffer.advance(8);
    let payload = buffer.split_to(length).freeze();
    let fin = flags & FLAG_FIN != 0;
    if first & 0x8000_0000 == 0 {
        let stream = first & 0x7fff_ffff;
        if stream == 0 {
            return Err(SpdyError::Garbled("a DATA frame on stream 0"));
        }
        return Ok(Some(Frame::Data {
            stream,
            fin,
            data: payload,
        }));
    }
    let version = ((first >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(SpdyError::Garbled(
            "a control frame of another SPDY version",
        ));
    }
    let stream_at = |at| u32_at(&payload, at).map(|id| id & 0x7fff_ffff);
    let exactly = |len: usize| match payload.len() == len {
        true => Ok(()),
        false => Err(SpdyError::Garbled("a control frame of the wrong length")),
    };
    let frame = match (first & 0xffff) as u16 {
        kind::SYN_STREAM if payload.len() >= 10 => Frame::SynStream {
            stream: stream_at(0)?,
            fin,
            block: payload.slice(10..),
        },
        kind::SYN_REPLY => Frame::SynReply {
            stream: stream_at(0)?,
            fin,
            block: payload.slice(4.min(payload.len())..),
        },
        kind::RST_STREAM => {
            exactly(8)?;
            Frame::RstStream {
                stream: stream_at(0)?,
                status: u32_at(&payload, 4)?,
            }
        }
        kind::SETTINGS => {
            let entries = u32_at(&payload, 0)?;
            if (payload.len() - 4) as u64 != u64::from(entries) * 8 {
                return Err(SpdyError::Garbled("a SETTINGS frame of the wrong length"));
            }
            Frame::Settings { entries }
        }
        kind::PING => {
            exactly(4)?;
            Frame::Ping {
                id: u32_at(&payload, 0)?,
            }
        }
        kind::GOAWAY => {
            exactly(8)?;
            Frame::GoAway {
                last_good: stream_at(0)?,
                status: u32_at(&payload, 4)?,
            }
        }
        kind::HEADERS => Frame::Headers {
            stream: stream_at(0)?,
            fin,
            block: payload.slice(4.min(payload.len())..),
        },
        kind::WINDOW_UPDATE => {
            exactly(8)?;
            Frame::WindowUpdate {
                stream: stream_at(0)?,
                delta: u32_at(&payload, 4)? & 0x7fff_ffff,
            }
        }
        kind::SYN_STREAM => return Err(SpdyError::Garbled("a SYN_STREAM too short")),
        kind => Frame::Unknown { kind },
    };
    Ok(Some(frame))
}

impl Frame {
    /// The frame's bytes, appended to `out`. A payload is at most 2^24 - 1
    /// bytes (the senders here split data at [`MAX_DATA_OUT`]).
    pub fn encode(&self, out: &mut BytesMut) {
        let control = |out: &mut BytesMut, kind: u16, flags: u8, payload: &[&[u8]]| {
            let length: usize = payload.iter().map(|part| part.len()).sum();
            debug_assert!(length < 1 << 24);
            out.put_u32(0x8000_0000 | (u32::from(VERSION) << 16) | u32::from(kind));
            out.put_u32((u32::from(flags) << 24) | (length as u32 & 0x00ff_ffff));
            for part in payload {
                out.put_slice(part);
            }
        };
        let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
        match self {
            Frame::Data { stream, fin, data } => {
                debug_assert!(data.len() < 1 << 24);
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u32((u32::from(fin_flag(*fin)) << 24) | (data.len() as u32 & 0x00ff_ffff));
                out.put_slice(data);
            }
            Frame::SynStream { stream, fin, block } => {
                let ids = [(stream & 0x7fff_ffff).to_be_bytes(), [0; 4]].concat();
                // Priority 0 (3 bits, then 5 unused), slot 0.
                control(
                    out,
                    kind::SYN_STREAM,
                    fin_flag(*fin),
                    &[&ids, &[0, 0], block],
                );
            }
            Frame::SynReply { stream, fin, block } => {
                let id = (stream & 0x7fff_ffff).to_be_bytes();
                control(out, kind::SYN_REPLY, fin_flag(*fin), &[&id, block]);
            }
            Frame::RstStream { stream, status } => {
                let (id, status) = ((stream & 0x7fff_ffff).to_be_bytes(), status.to_be_bytes());
                control(out, kind::RST_STREAM, 0, &[&id, &status]);
            }
            Frame::Settings { .. } => control(out, kind::SETTINGS, 0, &[&[0; 4]]),
            Frame::Ping { id } => control(out, kind::PING, 0, &[&id.to_be_bytes()]),
            Frame::GoAway { last_good, status } => {
                let id = (last_good & 0x7fff_ffff).to_be_bytes();
                control(out, kind::GOAWAY, 0, &[&id, &status.to_be_bytes()]);
            }
            Frame::Headers { stream, fin, block } => {
                let id = (stream & 0x7fff_ffff).to_be_bytes();
                control(out, kind::HEADERS, fin_flag(*fin), &[&id, block]);
            }
            Frame::WindowUpdate { stream, delta } => {
                let id = (stream & 0x7fff_ffff).to_be_bytes();
                control(out, kind::WINDOW_UPDATE, 0, &[&id, &delta.to_be_bytes()]);
            }
            Frame::Unknown { kind } => control(out, *kind, 0, &[]),
        }
    }
}

/// The client's side of SPDY header compression: one zlib stream for all
/// the blocks it sends, each block ending with a sync flush. No SPDY
/// dictionary (the zlib header says so, and Go's reader accepts that).
pub struct HeaderCompressor {
    zlib: flate2::Compress,
}

impl Default for HeaderCompressor {
    fn default() -> Self {
        HeaderCompressor {
            zlib: flate2::Compress::new(flate2::Compression::default(), true),
        }
    }
}

impl HeaderCompressor {
    /// The compressed name/value block of `headers` (names lowercase, as
    /// SPDY/3 wants them).
    pub fn block(&mut self, headers: &[(&str, &str)]) -> Result<Bytes, SpdyError> {
        let mut plain = Vec::new();
        plain.put_u32(headers.len() as u32);
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            plain.put_u32(name.len() as u32);
            plain.put_slice(name.as_bytes());
            plain.put_u32(value.len() as u32);
            plain.put_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = plain.as_slice();
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(plain.len() + 64);
            }
            let before = self.zlib.total_in();
            self.zlib
                .compress_vec(input, &mut out, flate2::FlushCompress::Sync)?;
            let taken = usize::try_from(self.zlib.total_in() - before).unwrap_or(input.len());
            input = &input[taken.min(input.len())..];
            // Done once all is in and the flush left room to spare.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out.into());
            }
        }
    }
}

//! The wire form of a tunnel's frames: raw link frames (see
//! [`transports::RAW_FRAME_MARKER`]), never beehive messages, so a
//! stream's bytes travel as they are.
//!
//! `[0xc1][kind: u8][stream id: u64 BE][body]`, the body by kind:
//!
//! | kind | body |
//! | --- | --- |
//! | `OPEN` (cloud to edge) | the request, as the caller encoded it |
//! | `ACCEPT` (edge to cloud) | empty |
//! | `DATA` | channel (u8), then the bytes |
//! | `END` | channel (u8): no more data on it from this side |
//! | `CREDIT` | u32 BE: bytes the sender may send more |
//! | `CLOSE` | UTF-8 reason; empty: a clean end |

use bytes::{BufMut, Bytes, BytesMut};
use transports::RAW_FRAME_MARKER;

/// The fixed part of every frame: marker, kind, id.
pub const HEADER: usize = 1 + 1 + 8;

/// One tunnel frame. `id` is always the stream's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Frame {
    /// Opens stream `id` with a request for the edge.
    Open { id: u64, request: Bytes },
    /// The edge serves stream `id`.
    Accept { id: u64 },
    /// Bytes on one of the stream's channels.
    Data { id: u64, channel: u8, bytes: Bytes },
    /// The sender sends no more on `channel` (stdin's end of file).
    End { id: u64, channel: u8 },
    /// The receiver took `bytes` more: the sender may send as many again.
    Credit { id: u64, bytes: u32 },
    /// Stream `id` is over: cleanly (empty reason) or not.
    Close { id: u64, reason: String },
}

const OPEN: u8 = 1;
const ACCEPT: u8 = 2;
const DATA: u8 = 3;
const END: u8 = 4;
const CREDIT: u8 = 5;
const CLOSE: u8 = 6;

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than its kind needs.
    #[error("a tunnel frame of {0} bytes is too short")]
    Short(usize),
    /// Not a tunnel frame.
    #[error("not a tunnel frame (first byte {0:#04x})")]
    NotTunnel(u8),
    /// A kind this side does not know.
    #[error("unknown tunnel frame kind {0}")]
    UnknownKind(u8),
    /// A close reason that is not UTF-8.
    #[error("a close reason that is not UTF-8")]
    Reason,
}

impl Frame {
    /// The stream the frame belongs to.
    pub fn id(&self) -> u64 {
        match self {
            Frame::Open { id, .. }
            | Frame::Accept { id }
            | Frame::Data { id, .. }
            | Frame::End { id, .. }
            | Frame::Credit { id, .. }
            | Frame::Close { id, .. } => *id,
        }
    }

    /// The frame as bytes for the link.
    pub fn encode(&self) -> Bytes {
        let (kind, body_len) = match self {
            Frame::Open { request, .. } => (OPEN, request.len()),
            Frame::Accept { .. } => (ACCEPT, 0),
            Frame::Data { bytes, .. } => (DATA, 1 + bytes.len()),
            Frame::End { .. } => (END, 1),
            Frame::Credit { .. } => (CREDIT, 4),
            Frame::Close { reason, .. } => (CLOSE, reason.len()),
        };
        let mut frame = BytesMut::with_capacity(HEADER + body_len);
        frame.put_u8(RAW_FRAME_MARKER);
        frame.put_u8(kind);
        frame.put_u64(self.id());
        match self {
            Frame::Open { request, .. } => frame.put_slice(request),
            Frame::Accept { .. } => {}
            Frame::Data { channel, bytes, .. } => {
                frame.put_u8(*channel);
                frame.put_slice(bytes);
            }
            Frame::End { channel, .. } => frame.put_u8(*channel),
            Frame::Credit { bytes, .. } => frame.put_u32(*bytes),
            Frame::Close { reason, .. } => frame.put_slice(reason.as_bytes()),
        }
        frame.freeze()
    }

    /// Reads a frame from the link (its bytes are shared, not copied).
    pub fn decode(frame: &Bytes) -> Result<Frame, FrameError> {
        if frame.len() < HEADER {
            return Err(FrameError::Short(frame.len()));
        }
        if frame[0] != RAW_FRAME_MARKER {
            return Err(FrameError::NotTunnel(frame[0]));
        }
        let kind = frame[1];
        let mut id = [0u8; 8];
        id.copy_from_slice(&frame[2..HEADER]);
        let id = u64::from_be_bytes(id);
        let body = frame.slice(HEADER..);
        let short = || FrameError::Short(frame.len());
        Ok(match kind {
            OPEN => Frame::Open { id, request: body },
            ACCEPT => Frame::Accept { id },
            DATA => Frame::Data {
                id,
                channel: *body.first().ok_or_else(short)?,
                bytes: body.slice(1..),
            },
            END => Frame::End {
                id,
                channel: *body.first().ok_or_else(short)?,
            },
            CREDIT => {
                let bytes: [u8; 4] = body
                    .get(..4)
                    .ok_or_else(short)?
                    .try_into()
                    .map_err(|_| short())?;
                Frame::Credit {
                    id,
                    bytes: u32::from_be_bytes(bytes),
                }
            }
            CLOSE => Frame::Close {
                id,
                reason: String::from_utf8(body.to_vec()).map_err(|_| FrameError::Reason)?,
            },
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_as_written() {
        let frames = [
            Frame::Open {
                id: 1,
                request: Bytes::from_static(b"\x82\xa1k\x01"),
            },
            Frame::Accept { id: 2 },
            Frame::Data {
                id: u64::MAX,
                channel: 1,
                bytes: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                id: 3,
                channel: 0,
                bytes: Bytes::new(),
            },
            Frame::End { id: 4, channel: 0 },
            Frame::Credit {
                id: 5,
                bytes: 65_536,
            },
            Frame::Close {
                id: 6,
                reason: "pod default/web is not on this node".to_owned(),
            },
            Frame::Close {
                id: 7,
                reason: String::new(),
            },
        ];
        for frame in frames {
            assert_eq!(Frame::decode(&frame.encode()), Ok(frame));
        }
    }

    #[test]
    fn bad_frames_are_refused_not_panicked_on() {
        let data = Frame::Data {
            id: 9,
            channel: 2,
            bytes: Bytes::from_static(b"x"),
        }
        .encode();
        for len in 0..HEADER {
            assert_eq!(
                Frame::decode(&data.slice(..len)),
                Err(FrameError::Short(len))
            );
        }
        // A DATA frame without its channel, a CREDIT without its count.
        assert!(Frame::decode(&data.slice(..HEADER)).is_err());
        let credit = Frame::Credit { id: 1, bytes: 7 }.encode();
        assert!(Frame::decode(&credit.slice(..HEADER + 2)).is_err());
        let mut unknown = data.to_vec();
        unknown[1] = 99;
        assert_eq!(
            Frame::decode(&Bytes::from(unknown)),
            Err(FrameError::UnknownKind(99))
        );
        let mut message = data.to_vec();
        message[0] = 0x83;
        assert_eq!(
            Frame::decode(&Bytes::from(message)),
            Err(FrameError::NotTunnel(0x83))
        );
        let mut reason = Frame::Close {
            id: 1,
            reason: "ab".to_owned(),
        }
        .encode()
        .to_vec();
        reason[HEADER] = 0xff;
        assert_eq!(Frame::decode(&Bytes::from(reason)), Err(FrameError::Reason));
    }
}

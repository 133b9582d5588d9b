//! Framing: one MessagePack-encoded message per frame, with a hard maximum
//! size. On byte streams (UDS, QUIC streams) a frame is a 4-byte big-endian
//! length followed by the payload; WebSocket frames are delimited by the
//! WebSocket layer itself. The codec is pure, with no I/O.

use beehive::Message;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::FrameError;

/// Bytes of the length prefix on byte streams.
pub const LENGTH_PREFIX: usize = 4;

/// Default maximum frame size: 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;

/// Encodes a message as a frame payload, refusing one larger than `max`.
pub fn encode(msg: &Message, max: usize) -> Result<Bytes, FrameError> {
    let payload = msg.to_bytes().map_err(FrameError::Encode)?;
    if payload.len() > max {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            max,
        });
    }
    Ok(Bytes::from(payload))
}

/// Decodes a frame payload into a message.
pub fn decode(payload: &[u8]) -> Result<Message, FrameError> {
    Message::from_bytes(payload).map_err(FrameError::Decode)
}

/// How a link turns messages into frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Codec {
    /// edgehive's own: MessagePack, one message per frame.
    #[default]
    MessagePack,
    /// KubeEdge's: JSON, one message per frame (see [`crate::kubeedge`]),
    /// for KubeEdge peers.
    KubeEdgeJson,
}

impl Codec {
    /// Encodes `msg`, refusing a frame larger than `max`.
    pub fn encode(self, msg: &Message, max: usize) -> Result<Bytes, FrameError> {
        match self {
            Codec::MessagePack => encode(msg, max),
            Codec::KubeEdgeJson => {
                let payload = crate::kubeedge::encode(msg);
                if payload.len() > max {
                    return Err(FrameError::TooLarge {
                        len: payload.len(),
                        max,
                    });
                }
                Ok(Bytes::from(payload))
            }
        }
    }

    /// Whether a frame payload carries nothing and is passed over (a
    /// KubeEdge peer's Go zero message, [`crate::kubeedge::is_zero_message`]).
    pub fn is_nothing(self, payload: &[u8]) -> bool {
        match self {
            Codec::MessagePack => false,
            Codec::KubeEdgeJson => crate::kubeedge::is_zero_message(payload),
        }
    }

    /// Decodes a frame payload (already within the frame limit).
    pub fn decode(self, payload: &[u8]) -> Result<Message, FrameError> {
        match self {
            Codec::MessagePack => decode(payload),
            Codec::KubeEdgeJson => crate::kubeedge::decode(payload, usize::MAX)
                .map_err(|err| FrameError::Foreign(err.to_string())),
        }
    }
}

/// Appends the length prefix and `payload` to `dst`.
pub fn put_length_prefixed(dst: &mut BytesMut, payload: &[u8]) {
    dst.reserve(LENGTH_PREFIX + payload.len());
    // Payloads are checked against the maximum (far below 4 GiB) before.
    dst.put_u32(payload.len() as u32);
    dst.put_slice(payload);
}

/// Splits length-prefixed frames off a byte buffer.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    max: usize,
}

impl FrameDecoder {
    /// A decoder that refuses frames larger than `max` bytes.
    pub fn new(max: usize) -> Self {
        FrameDecoder { max }
    }

    /// The maximum frame size.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes one complete frame payload off the front of `buf`, or `None`
    /// if more bytes are needed. An announced length over the maximum is an
    /// error before anything is reserved for it; otherwise room for exactly
    /// the rest of the frame is reserved, so `buf` never grows past
    /// `max + LENGTH_PREFIX` because of what a peer announced.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        let Some(header) = buf.get(..LENGTH_PREFIX) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > self.max {
            return Err(FrameError::TooLarge { len, max: self.max });
        }
        let total = LENGTH_PREFIX + len;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        buf.advance(LENGTH_PREFIX);
        Ok(Some(buf.split_to(len).freeze()))
    }

    /// What is left in `buf` when the stream ends: nothing, or a truncated frame.
    pub fn finish(&self, buf: &BytesMut) -> Result<(), FrameError> {
        if buf.is_empty() {
            return Ok(());
        }
        let expected = buf
            .get(..LENGTH_PREFIX)
            .map(|h| u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize + LENGTH_PREFIX)
            .unwrap_or(LENGTH_PREFIX);
        Err(FrameError::Truncated {
            got: buf.len(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body_len: usize) -> Message {
        Message::new()
            .build_router("a", "b", "ns/pod/x", "update")
            .with_content("x".repeat(body_len))
    }

    #[test]
    fn frames_round_trip_through_a_split_stream() {
        let decoder = FrameDecoder::new(DEFAULT_MAX_FRAME);
        let msgs: Vec<Message> = (0..50).map(|n| message(n * 37)).collect();
        let mut wire = BytesMut::new();
        for m in &msgs {
            put_length_prefixed(&mut wire, &encode(m, DEFAULT_MAX_FRAME).expect("encode"));
        }
        // Feed the stream in awkward pieces.
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in wire.chunks(7) {
            buf.extend_from_slice(chunk);
            while let Some(frame) = decoder.decode(&mut buf).expect("decode") {
                out.push(decode(&frame).expect("message"));
            }
        }
        decoder.finish(&buf).expect("nothing left over");
        assert_eq!(out, msgs);
    }

    #[test]
    fn an_oversized_announcement_is_refused_before_reserving() {
        let decoder = FrameDecoder::new(1024);
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3][..]);
        let before = buf.capacity();
        assert!(matches!(
            decoder.decode(&mut buf),
            Err(FrameError::TooLarge {
                len: 0xffff_ffff,
                max: 1024
            })
        ));
        assert_eq!(buf.capacity(), before);
    }

    #[test]
    fn exactly_the_maximum_passes_one_more_does_not() {
        let decoder = FrameDecoder::new(100);
        let mut buf = BytesMut::new();
        put_length_prefixed(&mut buf, &[7u8; 100]);
        assert_eq!(
            decoder.decode(&mut buf).expect("ok").map(|f| f.len()),
            Some(100)
        );
        put_length_prefixed(&mut buf, &[7u8; 101]);
        assert!(matches!(
            decoder.decode(&mut buf),
            Err(FrameError::TooLarge { len: 101, .. })
        ));
    }

    #[test]
    fn encode_refuses_a_message_over_the_limit() {
        let big = message(2_000);
        assert!(matches!(
            encode(&big, 1_000),
            Err(FrameError::TooLarge { max: 1_000, .. })
        ));
        assert!(encode(&big, 4_000).is_ok());
    }

    #[test]
    fn a_truncated_tail_is_reported() {
        let decoder = FrameDecoder::new(1024);
        let mut buf = BytesMut::new();
        put_length_prefixed(&mut buf, b"hello");
        buf.truncate(6);
        assert!(decoder.decode(&mut buf).expect("needs more").is_none());
        assert!(matches!(
            decoder.finish(&buf),
            Err(FrameError::Truncated {
                got: 6,
                expected: 9
            })
        ));
    }

    /// A small deterministic generator, so the fuzz runs are reproducible.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn random_bytes_never_panic_nor_grow_the_buffer_past_the_limit() {
        const MAX: usize = 4096;
        let decoder = FrameDecoder::new(MAX);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let len = (rng.next() % 64) as usize;
            let mut buf = BytesMut::with_capacity(len);
            for _ in 0..len {
                buf.put_u8(rng.next() as u8);
            }
            // Bias towards plausible small length prefixes half of the time.
            if rng.next().is_multiple_of(2) && buf.len() >= 4 {
                let claimed = (rng.next() % (2 * MAX as u64)) as u32;
                buf[..4].copy_from_slice(&claimed.to_be_bytes());
            }
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                assert!(frame.len() <= MAX);
                // Garbage payloads are errors, never panics.
                let _ = decode(&frame);
            }
            assert!(
                buf.capacity() <= MAX + LENGTH_PREFIX + 64,
                "capacity {}",
                buf.capacity()
            );
        }
    }

    #[test]
    fn random_payloads_never_panic_the_message_decoder() {
        let mut rng = XorShift(42);
        let valid = encode(&message(10), DEFAULT_MAX_FRAME).expect("encode");
        for _ in 0..20_000 {
            let mut bytes = valid.to_vec();
            // Flip, cut or extend a valid frame: the interesting inputs.
            match rng.next() % 3 {
                0 => {
                    let i = (rng.next() as usize) % bytes.len();
                    bytes[i] = rng.next() as u8;
                }
                1 => bytes.truncate((rng.next() as usize) % bytes.len()),
                _ => bytes.extend((0..(rng.next() % 16)).map(|_| rng.next() as u8)),
            }
            let _ = decode(&bytes);
        }
    }
}

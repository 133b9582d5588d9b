//! Frames over any byte stream: a 4-byte length prefix, then the payload.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::io::poll_read_buf;

use crate::error::TransportError;
use crate::frame::FrameDecoder;
use crate::link::{FrameSink, FrameSource, Lane};

/// Free room a reader first makes before it reads. Buffers start empty and
/// are let go whenever the link falls idle, so an idle link holds no read
/// buffer.
const READ_CHUNK: usize = 8 * 1024;

/// The most room a reader makes. While reads keep filling the room they
/// were given, the room doubles up to this, and halves each time the link
/// falls idle: a busy link reads many frames per system call (256 B frames
/// over a Unix socket went from 3.4-3.9 M/s to 4.6 M/s).
const READ_CHUNK_MAX: usize = 64 * 1024;

/// Buffered frames are written out once this many bytes wait.
const WRITE_HIGH_WATER: usize = 64 * 1024;

/// A frame at least this large is written straight through, not copied.
const WRITE_THROUGH: usize = 32 * 1024;

/// Reads length-prefixed frames from a byte stream.
pub(crate) struct StreamSource<R> {
    reader: R,
    buf: BytesMut,
    decoder: FrameDecoder,
    /// Free room made before a read: grows while reads fill it.
    chunk: usize,
}

impl<R> StreamSource<R> {
    pub(crate) fn new(reader: R, max_frame: usize) -> Self {
        StreamSource {
            reader,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(max_frame),
            chunk: READ_CHUNK,
        }
    }

    /// The largest frame this source accepts (QUIC reads its independent
    /// streams within the same limit).
    #[cfg(feature = "quic")]
    pub(crate) fn max_frame(&self) -> usize {
        self.decoder.max()
    }
}

impl<R: AsyncRead + Unpin + Send + 'static> FrameSource for StreamSource<R> {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        loop {
            // A partial frame stays in `buf` until the rest arrives.
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                return Poll::Ready(Ok(Some(frame)));
            }
            // Room for a chunk, unless much of a large frame is already
            // here: then the decoder has reserved exactly its rest, and
            // topping up would copy what came so far.
            if self.buf.len() < READ_CHUNK && self.buf.capacity() - self.buf.len() < self.chunk {
                // Bounded, whatever the peer says its frames are.
                self.buf.reserve(self.chunk);
            }
            let room = self.buf.capacity() - self.buf.len();
            let read = match poll_read_buf(Pin::new(&mut self.reader), cx, &mut self.buf) {
                Poll::Ready(read) => read.map_err(|e| TransportError::io("read", e))?,
                Poll::Pending => {
                    if self.buf.is_empty() {
                        // Nothing half-read: an idle link keeps no buffer,
                        // and a quiet one goes back to small reads.
                        self.buf = BytesMut::new();
                        self.chunk = (self.chunk / 2).max(READ_CHUNK);
                    }
                    return Poll::Pending;
                }
            };
            if read == 0 {
                self.decoder.finish(&self.buf)?;
                return Poll::Ready(Ok(None));
            }
            // A full read of at least a chunk shows more waiting; filling
            // the small rest of a frame the decoder reserved does not.
            if read == room && room >= self.chunk {
                self.chunk = (self.chunk * 2).min(READ_CHUNK_MAX);
            }
        }
    }
}

/// Writes length-prefixed frames to a byte stream, buffered. The buffer
/// is allocated as frames arrive (none on an idle link) and large frames
/// bypass it.
pub(crate) struct StreamSink<W: AsyncWrite> {
    writer: W,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> StreamSink<W> {
    pub(crate) fn new(writer: W) -> Self {
        StreamSink {
            writer,
            buf: Vec::new(),
        }
    }

    /// The underlying writer.
    #[allow(dead_code)]
    pub(crate) fn get_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    async fn write_buffered(&mut self) -> Result<(), TransportError> {
        if !self.buf.is_empty() {
            self.writer
                .write_all(&self.buf)
                .await
                .map_err(|e| TransportError::io("write", e))?;
            self.buf.clear();
        }
        if self.buf.capacity() > 4 * WRITE_HIGH_WATER {
            self.buf = Vec::new();
        }
        Ok(())
    }
}

/// Writes one length-prefixed frame.
pub(crate) async fn write_prefixed<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &[u8],
) -> Result<(), TransportError> {
    let len = u32::try_from(frame.len())
        .map_err(|_| TransportError::Config("frame longer than 4 GiB".into()))?;
    writer
        .write_all(&len.to_be_bytes())
        .await
        .map_err(|e| TransportError::io("write", e))?;
    writer
        .write_all(frame)
        .await
        .map_err(|e| TransportError::io("write", e))
}

impl<W: AsyncWrite + Unpin + Send + 'static> FrameSink for StreamSink<W> {
    async fn write_frame(&mut self, frame: Bytes, _lane: Lane) -> Result<(), TransportError> {
        if frame.len() >= WRITE_THROUGH {
            self.write_buffered().await?;
            return write_prefixed(&mut self.writer, &frame).await;
        }
        let len = u32::try_from(frame.len())
            .map_err(|_| TransportError::Config("frame longer than 4 GiB".into()))?;
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(&frame);
        if self.buf.len() >= WRITE_HIGH_WATER {
            self.write_buffered().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        self.write_buffered().await?;
        self.writer
            .flush()
            .await
            .map_err(|e| TransportError::io("flush", e))
    }

    async fn close(&mut self) {
        let _ = self.write_buffered().await;
        let _ = self.writer.flush().await;
        let _ = self.writer.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn prefixed(payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(payload);
        out
    }

    /// Polls once, the way a receiver's task would.
    fn poll<R: AsyncRead + Unpin + Send + 'static>(
        source: &mut StreamSource<R>,
    ) -> Poll<Result<Option<Bytes>, TransportError>> {
        let waker = std::task::Waker::noop();
        source.poll_frame(&mut Context::from_waker(waker))
    }

    #[tokio::test]
    async fn a_busy_reader_reads_more_at_once_and_an_idle_one_keeps_no_buffer() {
        let (mut writer, reader) = tokio::io::duplex(1024 * 1024);
        let mut source = StreamSource::new(reader, 1024);
        let frame = prefixed(&[7u8; 200]);
        let burst: Vec<u8> = std::iter::repeat_n(frame.as_slice(), 1000)
            .flatten()
            .copied()
            .collect();
        writer.write_all(&burst).await.expect("write");

        for _ in 0..1000 {
            match poll(&mut source) {
                Poll::Ready(Ok(Some(payload))) => assert_eq!(payload.as_ref(), &[7u8; 200]),
                other => panic!("expected a frame of the burst, got {other:?}"),
            }
        }
        assert_eq!(
            source.chunk, READ_CHUNK_MAX,
            "reads that fill their room grow it"
        );
        assert!(poll(&mut source).is_pending());
        assert_eq!(
            source.buf.capacity(),
            0,
            "idle with nothing half-read: no buffer"
        );
        assert_eq!(
            source.chunk,
            READ_CHUNK_MAX / 2,
            "a quiet link reads less at once"
        );

        // Half a frame stays buffered until the rest comes.
        writer.write_all(&frame[..100]).await.expect("write");
        assert!(poll(&mut source).is_pending());
        assert_eq!(source.buf.len(), 100);
        writer.write_all(&frame[100..]).await.expect("write");
        match poll(&mut source) {
            Poll::Ready(Ok(Some(payload))) => assert_eq!(payload.len(), 200),
            other => panic!("expected the frame, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_large_frame_arriving_in_pieces_is_not_copied_on_the_way() {
        let (mut writer, reader) = tokio::io::duplex(1024 * 1024);
        let mut source = StreamSource::new(reader, 256 * 1024);
        let frame = prefixed(&[9u8; 200_000]);
        let mut pieces = frame.chunks(10_000);
        writer
            .write_all(pieces.next().expect("a piece"))
            .await
            .expect("write");
        assert!(poll(&mut source).is_pending());
        // By now the decoder has room for the whole frame.
        let start = source.buf.as_ptr() as usize;
        let mut got = None;
        for piece in pieces {
            writer.write_all(piece).await.expect("write");
            if let Poll::Ready(next) = poll(&mut source) {
                got = Some(next.expect("a frame").expect("not the end"));
            }
        }
        let payload = got.expect("the whole frame");
        assert_eq!(payload.as_ref(), &[9u8; 200_000][..]);
        assert_eq!(
            payload.as_ptr() as usize,
            start + 4,
            "every piece was read into the room reserved for the frame"
        );
    }
}

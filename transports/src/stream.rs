//! Frames over any byte stream: a 4-byte length prefix, then the payload.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::io::poll_read_buf;

use crate::error::TransportError;
use crate::frame::FrameDecoder;
use crate::link::{FrameSink, FrameSource, Lane};

/// Room a reader adds when its buffer is full. Buffers start empty and
/// grow only as traffic needs, so an idle link costs little memory.
const READ_CHUNK: usize = 8 * 1024;

/// Buffered frames are written out once this many bytes wait.
const WRITE_HIGH_WATER: usize = 64 * 1024;

/// A frame at least this large is written straight through, not copied.
const WRITE_THROUGH: usize = 32 * 1024;

/// Reads length-prefixed frames from a byte stream.
pub(crate) struct StreamSource<R> {
    reader: R,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl<R> StreamSource<R> {
    pub(crate) fn new(reader: R, max_frame: usize) -> Self {
        StreamSource {
            reader,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(max_frame),
        }
    }
}

impl<R: AsyncRead + Unpin + Send + 'static> FrameSource for StreamSource<R> {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        loop {
            // A partial frame stays in `buf` until the rest arrives.
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                return Poll::Ready(Ok(Some(frame)));
            }
            if self.buf.capacity() == self.buf.len() {
                // Only while waiting for a frame header: bounded, whatever the peer says.
                self.buf.reserve(READ_CHUNK);
            }
            let read = ready!(poll_read_buf(Pin::new(&mut self.reader), cx, &mut self.buf))
                .map_err(|e| TransportError::io("read", e))?;
            if read == 0 {
                self.decoder.finish(&self.buf)?;
                return Poll::Ready(Ok(None));
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

//! Frames over any byte stream: a 4-byte length prefix, then the payload.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio_util::io::poll_read_buf;

use crate::error::TransportError;
use crate::frame::{FrameDecoder, LENGTH_PREFIX};
use crate::link::{FrameSink, FrameSource, Lane};

/// Bytes of buffer a stream reader starts with.
const READ_BUFFER: usize = 64 * 1024;

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
            buf: BytesMut::with_capacity(READ_BUFFER),
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
                self.buf.reserve(READ_BUFFER);
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

/// Writes length-prefixed frames to a byte stream, buffered.
pub(crate) struct StreamSink<W: AsyncWrite> {
    writer: BufWriter<W>,
}

impl<W: AsyncWrite> StreamSink<W> {
    pub(crate) fn new(writer: W) -> Self {
        StreamSink {
            writer: BufWriter::with_capacity(READ_BUFFER, writer),
        }
    }

    /// The underlying writer.
    #[allow(dead_code)]
    pub(crate) fn get_mut(&mut self) -> &mut W {
        self.writer.get_mut()
    }
}

/// Writes one length-prefixed frame.
pub(crate) async fn write_prefixed<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &[u8],
) -> Result<(), TransportError> {
    let len = u32::try_from(frame.len())
        .map_err(|_| TransportError::Config("frame longer than 4 GiB".into()))?;
    let mut header = [0u8; LENGTH_PREFIX];
    header.copy_from_slice(&len.to_be_bytes());
    writer
        .write_all(&header)
        .await
        .map_err(|e| TransportError::io("write", e))?;
    writer
        .write_all(frame)
        .await
        .map_err(|e| TransportError::io("write", e))
}

impl<W: AsyncWrite + Unpin + Send + 'static> FrameSink for StreamSink<W> {
    async fn write_frame(&mut self, frame: Bytes, _lane: Lane) -> Result<(), TransportError> {
        write_prefixed(&mut self.writer, &frame).await
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        self.writer
            .flush()
            .await
            .map_err(|e| TransportError::io("flush", e))
    }

    async fn close(&mut self) {
        let _ = self.writer.flush().await;
        let _ = self.writer.shutdown().await;
    }
}

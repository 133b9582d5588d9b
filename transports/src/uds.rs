//! Unix domain socket transport: length-prefixed frames on one ordered
//! stream. No TLS: access is controlled by the socket file's permissions,
//! and the peer is identified by its credentials (uid, pid).

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::error::{FrameError, TransportError};
use crate::frame::Codec;
use crate::link::{Limits, Link, PeerIdentity, spawn_link};
use crate::listener::Listener;
use crate::stream::{StreamSink, StreamSource};
use crate::{
    BoxFuture, DialOptions, ListenOptions, PREAMBLE, Transport, TransportKind, refuse_tls,
};

/// The Unix domain socket transport; the address is the socket's path.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnixSocket;

fn describe(stream: &UnixStream) -> String {
    match stream.peer_cred() {
        Ok(cred) => format!(
            "uds:uid={},pid={}",
            cred.uid(),
            cred.pid().map_or_else(|| "?".to_owned(), |p| p.to_string())
        ),
        Err(_) => "uds:unknown".to_owned(),
    }
}

fn link(stream: UnixStream, remote: String, limits: &Limits) -> Link {
    let (read, write) = stream.into_split();
    spawn_link(
        PeerIdentity {
            remote,
            ..PeerIdentity::default()
        },
        StreamSource::new(read, limits.max_frame),
        StreamSink::new(write),
        limits,
        Codec::MessagePack,
    )
}

async fn expect_preamble(stream: &mut UnixStream) -> Result<(), TransportError> {
    let mut preamble = [0u8; 4];
    stream
        .read_exact(&mut preamble)
        .await
        .map_err(|e| TransportError::io("read preamble", e))?;
    if preamble != PREAMBLE {
        return Err(FrameError::Protocol(format!("preamble {preamble:02x?}")).into());
    }
    Ok(())
}

/// Removes a stale socket file left by an earlier run; refuses to remove
/// anything that is not a socket.
fn clear_stale_socket(path: &PathBuf) -> Result<(), TransportError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| TransportError::io(format!("remove stale socket {}", path.display()), e)),
        Ok(_) => Err(TransportError::Config(format!(
            "{} exists and is not a socket",
            path.display()
        ))),
        Err(_) => Ok(()),
    }
}

impl Transport for UnixSocket {
    fn kind(&self) -> TransportKind {
        TransportKind::UnixSocket
    }

    fn listen<'a>(
        &'a self,
        options: &'a ListenOptions,
    ) -> BoxFuture<'a, Result<Listener, TransportError>> {
        Box::pin(async move {
            crate::native_codec_only(options.codec, "uds")?;
            refuse_tls(options.has_tls(), "uds")?;
            let path = PathBuf::from(&options.address);
            clear_stale_socket(&path)?;
            let socket = UnixListener::bind(&path)
                .map_err(|e| TransportError::io(format!("bind {}", path.display()), e))?;
            let cleanup = path.clone();
            let listener = Listener::new(options.address.clone(), &options.limits, move |queue| {
                tokio::spawn(async move {
                    loop {
                        match socket.accept().await {
                            Ok((mut stream, _)) => {
                                let remote = describe(&stream);
                                let limits = *queue.limits();
                                queue.handshake(remote.clone(), async move {
                                    expect_preamble(&mut stream).await?;
                                    Ok(link(stream, remote, &limits))
                                });
                            }
                            Err(err) => {
                                // Out of descriptors and the like: back off, keep serving.
                                warn!(error = %err, "uds accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                })
            });
            Ok(listener.on_shutdown(move || {
                Box::pin(async move {
                    let _ = std::fs::remove_file(cleanup);
                })
            }))
        })
    }

    fn dial<'a>(&'a self, options: &'a DialOptions) -> BoxFuture<'a, Result<Link, TransportError>> {
        Box::pin(async move {
            crate::native_codec_only(options.codec, "uds")?;
            refuse_tls(options.has_tls(), "uds")?;
            let limits = options.limits;
            let mut stream = tokio::time::timeout(
                limits.connect_timeout,
                UnixStream::connect(&options.address),
            )
            .await
            .map_err(|_| TransportError::Timeout {
                what: "connect",
                after: limits.connect_timeout,
            })?
            .map_err(|e| TransportError::io(format!("connect {}", options.address), e))?;
            stream
                .write_all(&PREAMBLE)
                .await
                .map_err(|e| TransportError::io("write preamble", e))?;
            Ok(link(stream, format!("uds:{}", options.address), &limits))
        })
    }
}

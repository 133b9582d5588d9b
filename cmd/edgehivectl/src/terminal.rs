//! `exec` and `attach`: a WebSocket to the admin API speaking Kubernetes'
//! `v5.channel.k8s.io` (one byte of channel before each message), the
//! local terminal in raw mode while it lasts, its size sent at the start
//! and on every change, and the command's exit code as this process's.
//! `port-forward`: a WebSocket per local connection, channel 0 its bytes,
//! channel 1 an error.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result, bail};
use cloud::AdminClient;
use cloud::admin_client::Connection;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const PROTOCOL: &str = "v5.channel.k8s.io";
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// The terminal in raw mode until dropped.
struct Raw {
    saved: rustix::termios::Termios,
}

impl Raw {
    fn enter() -> Option<Raw> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The terminal's size as the channel protocol sends it: the local
/// terminal's, or `COLUMNS` and `LINES` when there is none.
fn size() -> Option<Vec<u8>> {
    let (width, height) = match rustix::termios::tcgetwinsize(std::io::stdout()) {
        Ok(size) if size.ws_col > 0 => (u32::from(size.ws_col), u32::from(size.ws_row)),
        _ => {
            let env = |name: &str| std::env::var(name).ok()?.parse::<u32>().ok();
            (env("COLUMNS")?, env("LINES")?)
        }
    };
    let mut frame = vec![RESIZE];
    frame.extend_from_slice(
        serde_json::json!({ "Width": width, "Height": height })
            .to_string()
            .as_bytes(),
    );
    Some(frame)
}

/// The exit code a `Status` on the error channel says.
fn exit_code(status: &[u8]) -> Result<i32> {
    let status: Value = serde_json::from_slice(status).context("the command's outcome")?;
    if status["status"] == "Success" {
        return Ok(0);
    }
    let code = status["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|cause| cause["reason"] == "ExitCode")
        .and_then(|cause| cause["message"].as_str()?.parse::<i32>().ok());
    match code {
        Some(code) => Ok(code),
        None => bail!(
            "{}",
            status["message"].as_str().unwrap_or("the command failed")
        ),
    }
}

/// Whether a terminal asked for (`-t`) can be used, as kubectl decides:
/// not without stdin (`-i`), and not when stdin is no terminal, which is
/// said on stderr (a remote terminal would never see the input end, so
/// the command would never end).
pub fn usable_tty(stdin: bool, tty: bool) -> bool {
    if !(stdin && tty) {
        return false;
    }
    if !std::io::stdin().is_terminal() {
        eprintln!("Unable to use a TTY - input is not a terminal or the right kind of file");
        return false;
    }
    true
}

/// Runs the exec or attach at `path` of the admin API `client` talks
/// to: its exit code.
pub async fn run(client: &AdminClient, path: &str, stdin: bool, tty: bool) -> Result<i32> {
    let socket = connect(client, path, PROTOCOL).await?;
    let (mut to_server, mut from_server) = socket.split();
    let raw = (tty && stdin && std::io::stdin().is_terminal())
        .then(Raw::enter)
        .flatten();
    if tty && let Some(frame) = size() {
        to_server
            .send(Message::Binary(frame.into()))
            .await
            .context("the size")?;
    }
    let (frames, mut outgoing) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    if stdin {
        let frames = frames.clone();
        tokio::spawn(async move {
            let mut input = tokio::io::stdin();
            let mut buffer = vec![0u8; 16 * 1024];
            loop {
                match input.read(&mut buffer).await {
                    Ok(0) | Err(_) => {
                        let _ = frames.send(vec![CLOSE, STDIN]);
                        return;
                    }
                    Ok(n) => {
                        let mut frame = Vec::with_capacity(n + 1);
                        frame.push(STDIN);
                        frame.extend_from_slice(&buffer[..n]);
                        if frames.send(frame).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    if tty && raw.is_some() {
        let frames = frames.clone();
        tokio::spawn(async move {
            let Ok(mut changes) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while changes.recv().await.is_some() {
                if let Some(frame) = size()
                    && frames.send(frame).is_err()
                {
                    return;
                }
            }
        });
    }
    drop(frames);
    let sending = async {
        while let Some(frame) = outgoing.recv().await {
            if to_server.send(Message::Binary(frame.into())).await.is_err() {
                return;
            }
        }
        // Nothing more to send: the exchange goes on until the server ends it.
        std::future::pending::<()>().await
    };
    let receiving = async {
        let mut code = None;
        while let Some(message) = from_server.next().await {
            let frame = match message {
                Ok(Message::Binary(frame)) => frame,
                Ok(Message::Close(_)) => break,
                Ok(_) => continue,
                Err(err) => return Err(anyhow::anyhow!("the connection: {err}")),
            };
            let Some((&channel, data)) = frame.split_first() else {
                continue;
            };
            match channel {
                STDOUT => {
                    let mut out = std::io::stdout();
                    out.write_all(data).context("stdout")?;
                    out.flush().context("stdout")?;
                }
                STDERR => {
                    let mut err = std::io::stderr();
                    err.write_all(data).context("stderr")?;
                    err.flush().context("stderr")?;
                }
                ERROR if !data.is_empty() => code = Some(exit_code(data)),
                _ => {}
            }
        }
        code.unwrap_or(Ok(0))
    };
    let code = tokio::select! {
        code = receiving => code,
        () = sending => Ok(0),
    };
    drop(raw);
    code
}

/// The admin API's WebSocket at `path` with `protocol`: over TLS and
/// with the bearer token when the client has them.
type Socket = tokio_tungstenite::WebSocketStream<std::pin::Pin<Box<dyn Connection>>>;

/// Opens the admin API's WebSocket at `path` with `protocol`.
async fn connect(client: &AdminClient, path: &str, protocol: &str) -> Result<Socket> {
    let mut request = client
        .websocket_url(path)
        .into_client_request()
        .context("the request")?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        protocol.parse().context("protocol")?,
    );
    if let Some(authorization) = client.authorization() {
        request.headers_mut().insert(
            "Authorization",
            authorization.parse().context("the bearer token")?,
        );
    }
    let server = client.address();
    let stream = client.connect().await?;
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            let status: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let reason = status["reason"]
                .as_str()
                .map_or_else(|| response.status().as_u16().to_string(), str::to_owned);
            let message = status["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
            bail!("Error from server ({reason}): {message}");
        }
        Err(err) => bail!("the admin API at {server}: {err}"),
    }
}

/// Forwards each `LOCAL:REMOTE` (or `PORT`) of `ports` from `address`
/// to the pod behind `path`, until interrupted.
pub async fn forward(
    client: &AdminClient,
    path: &str,
    address: &str,
    ports: &[String],
) -> Result<()> {
    for mapping in ports {
        let (local, remote) = match mapping.split_once(':') {
            Some((local, remote)) => (local, remote),
            None => (mapping.as_str(), mapping.as_str()),
        };
        let remote: u16 = remote
            .parse()
            .with_context(|| format!("port {remote:?} in {mapping:?}"))?;
        let listener = tokio::net::TcpListener::bind(format!("{address}:{local}"))
            .await
            .with_context(|| format!("listening on {address}:{local}"))?;
        let bound = listener.local_addr().context("local address")?;
        println!("Forwarding from {bound} -> {remote}");
        let (client, path) = (client.clone(), format!("{path}?ports={remote}"));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (client, path) = (client.clone(), path.clone());
                tokio::spawn(async move {
                    if let Err(err) = one_connection(&client, &path, tcp).await {
                        eprintln!("error: {err:#}");
                    }
                });
            }
        });
    }
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}

async fn one_connection(
    client: &AdminClient,
    path: &str,
    tcp: tokio::net::TcpStream,
) -> Result<()> {
    let socket = connect(client, path, "v4.channel.k8s.io").await?;
    let (mut to_server, mut from_server) = socket.split();
    let (mut from_local, mut to_local) = tcp.into_split();
    let upstream = async {
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            match from_local.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let mut frame = Vec::with_capacity(n + 1);
                    frame.push(0);
                    frame.extend_from_slice(&buffer[..n]);
                    if to_server.send(Message::Binary(frame.into())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let downstream = async {
        // Each channel's first message is its port.
        let mut prefixed = [false; 2];
        while let Some(Ok(message)) = from_server.next().await {
            let Message::Binary(frame) = message else {
                continue;
            };
            let Some((&channel, data)) = frame.split_first() else {
                continue;
            };
            let channel = usize::from(channel.min(1));
            if !prefixed[channel] {
                prefixed[channel] = true;
                continue;
            }
            match channel {
                0 => {
                    if tokio::io::AsyncWriteExt::write_all(&mut to_local, data)
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                }
                _ => bail!("{}", String::from_utf8_lossy(data)),
            }
        }
        Ok(())
    };
    tokio::select! {
        () = upstream => Ok(()),
        ended = downstream => ended,
    }
}

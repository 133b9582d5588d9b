//! The cloud's streams to the pods edged runs (`stream`), served as a
//! kubelet serves its streaming API: a command run in a container and an
//! attach through CRI `Exec` / `Attach` and containerd's streaming server
//! (its SPDY side, protocol `v4.channel.k8s.io`, [`crate::spdy`]: the
//! caller's end of stdin reaches the command), a forwarded port through
//! CRI `PortForward` and the streaming server's WebSocket side, a
//! container's log from its log file ([`crate::logs`]).
//!
//! Every stream names a pod: one edged does not run is refused, so a
//! stream never reaches another node's pod, whatever the cloud asks.

mod port_forward;

use std::path::PathBuf;
use std::sync::Arc;

use apis::k8s::Pod;
use apis::streams::{
    Io, LogOptions, PodRef, StatsKind, StreamRequest, UpgradeTarget, channel, is_upgrade_header,
};
use bytes::Bytes;
use futures_util::FutureExt as _;
use port_forward::{RuntimeSocket, carry, port_forward};
use stream::{Chunk, PendingStream, StreamHandler};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tracing::Instrument as _;
use tracing::{debug, info_span};

use crate::cri::{Cri, api};
use crate::server::PodsView;
use crate::spdy;
use crate::stats::StatsCollector;

/// How long a connection (to a pod, to the runtime's streaming server) may
/// take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The WebSocket subprotocol spoken to the runtime's streaming server
/// for a forwarded port.
const CHANNEL_PROTOCOL: &str = "v4.channel.k8s.io";

/// Serves the streams the cloud opens to this node's pods.
pub struct PodStreamServer {
    pods: PodsView,
    cri: Cri,
    root: PathBuf,
    stats: Arc<StatsCollector>,
}

impl PodStreamServer {
    /// Serves the pods in `pods` (edged's view) through `cri`; their logs
    /// are under `root`; the node's figures from `stats`.
    pub fn new(
        pods: PodsView,
        cri: Cri,
        root: PathBuf,
        stats: Arc<StatsCollector>,
    ) -> Arc<PodStreamServer> {
        Arc::new(PodStreamServer {
            pods,
            cri,
            root,
            stats,
        })
    }

    /// The pod, if edged runs it.
    fn pod(&self, pod: &PodRef) -> Option<Pod> {
        let key = format!("{}/{}", pod.namespace, pod.name);
        self.pods.read().ok()?.get(&key).cloned()
    }
}

/// The runtime's id of `container` in `pod`, if it has one.
fn container_id(pod: &Pod, container: &str) -> Result<String, String> {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|s| s.name == container));
    let Some(status) = status else {
        return Err(format!("container {container} is not in the pod"));
    };
    if status
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .is_none()
    {
        return Err(format!("container {container} is not running"));
    }
    status
        .container_id
        .as_deref()
        .map(|id| id.rsplit_once("://").map_or(id, |(_, id)| id).to_owned())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| format!("container {container} has no runtime id yet"))
}

impl StreamHandler for PodStreamServer {
    fn open(&self, request: Bytes, pending: PendingStream) {
        let request = match StreamRequest::decode(&request) {
            Ok(request) => request,
            Err(err) => return pending.refuse(&format!("a request this node cannot read: {err}")),
        };
        let pod = match request.pod().map(|pod| (pod, self.pod(pod))) {
            Some((pod, None)) => {
                return pending.refuse(&format!(
                    "pod {}/{} is not on this node",
                    pod.namespace, pod.name
                ));
            }
            Some((_, Some(pod))) => Some(pod),
            None => None,
        };
        let (cri, root, stats) = (self.cri.clone(), self.root.clone(), self.stats.clone());
        let span = info_span!("stream", kind = kind_of(&request));
        tokio::spawn(
            async move {
                match (request, pod) {
                    (
                        StreamRequest::Exec {
                            container,
                            command,
                            io,
                            ..
                        },
                        Some(pod),
                    ) => {
                        let target = UpgradeTarget::Exec {
                            container,
                            command,
                            io,
                        };
                        in_container(&cri, &pod, target, pending).await
                    }
                    (StreamRequest::Attach { container, io, .. }, Some(pod)) => {
                        let target = UpgradeTarget::Attach { container, io };
                        in_container(&cri, &pod, target, pending).await
                    }
                    (
                        StreamRequest::Logs {
                            container, options, ..
                        },
                        Some(pod),
                    ) => logs(&root, &pod, &container, options, pending).await,
                    (StreamRequest::PortForward { port, .. }, Some(pod)) => {
                        port_forward(&cri, &pod, port, pending).await
                    }
                    (
                        StreamRequest::Upgrade {
                            target,
                            method,
                            headers,
                            ..
                        },
                        Some(pod),
                    ) => upgrade(&cri, &pod, target, &method, &headers, pending).await,
                    (StreamRequest::Stats { what }, None) => figures(&stats, what, pending).await,
                    (request, _) => pending.refuse(&format!(
                        "{} is not served by this node yet",
                        kind_of(&request)
                    )),
                }
            }
            .instrument(span),
        );
    }
}

fn kind_of(request: &StreamRequest) -> &'static str {
    match request {
        StreamRequest::Logs { .. } => "logs",
        StreamRequest::Exec { .. } => "exec",
        StreamRequest::Attach { .. } => "attach",
        StreamRequest::PortForward { .. } => "port-forward",
        StreamRequest::Stats { .. } => "stats",
        StreamRequest::Upgrade { target, .. } => match target {
            UpgradeTarget::Exec { .. } => "exec (upgrade)",
            UpgradeTarget::Attach { .. } => "attach (upgrade)",
            UpgradeTarget::PortForward { .. } => "port-forward (upgrade)",
        },
    }
}

/// A command run in a container, or an attach, over the runtime's SPDY
/// side: CRI's streaming URL ([`streaming_url`]), then [`remote_command`].
async fn in_container(cri: &Cri, pod: &Pod, target: UpgradeTarget, pending: PendingStream) {
    let io = match &target {
        UpgradeTarget::Exec { io, .. } | UpgradeTarget::Attach { io, .. } => *io,
        UpgradeTarget::PortForward { .. } => Io::default(),
    };
    // The streams the CRI request asks for, as the runtime will wait for
    // them (`spdy` leaves stderr out with a terminal: merged into its
    // output).
    let wanted = spdy::Wanted {
        stdin: io.stdin,
        stdout: io.stdout,
        stderr: io.stderr,
        tty: io.tty,
    };
    match streaming_url(cri, pod, target).await {
        Ok(url) => remote_command(&url, wanted, pending).await,
        Err(reason) => pending.refuse(&reason),
    }
}

/// One message of Kubernetes' channel protocol: the channel's byte, then
/// the bytes (the port-forward data channel is 0, as stdin).
fn channel_message(channel: u8, bytes: &[u8]) -> WsMessage {
    let mut frame = Vec::with_capacity(bytes.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(bytes);
    WsMessage::Binary(frame.into())
}

/// The runtime's streaming server at `url`, over WebSocket
/// (`v4.channel.k8s.io`).
async fn connect_runtime(url: &str) -> Result<RuntimeSocket, String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!("a streaming URL this node cannot reach: {url}"));
    };
    let ws_url = format!("ws://{rest}");
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|err| err.to_string())?;
    let protocol = CHANNEL_PROTOCOL
        .parse()
        .map_err(|_| "protocol header".to_owned())?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol);
    let host = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or("no host in the streaming URL")?;
    let connected = async {
        let tcp = tokio::net::TcpStream::connect(&host)
            .await
            .map_err(|err| format!("the runtime's streaming server: {err}"))?;
        let (ws, _) = tokio_tungstenite::client_async(request, tcp)
            .await
            .map_err(|err| format!("the runtime's streaming server: {err}"))?;
        Ok(ws)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connected)
        .await
        .unwrap_or_else(|_| Err("the runtime's streaming server did not answer".to_owned()))
}

/// Speaks the remote command protocol over SPDY to the runtime's
/// streaming server at `url` and carries the channels both ways: the
/// runtime's stdout, stderr and outcome (channel 3, a `Status`) to the
/// cloud; the cloud's stdin and resizes to the runtime, the end of its
/// stdin as the end of the command's. The runtime ending the session
/// ends the stream; so does the cloud's side going.
///
/// With a terminal the end of stdin is not passed on: containerd's shim
/// shuts the whole console when a terminal's input ends, and the output
/// still on its way is lost (a terminal's end of input is its ^D, a byte
/// like the others).
async fn remote_command(url: &str, wanted: spdy::Wanted, pending: PendingStream) {
    let (mut from_runtime, to_runtime) = match spdy::connect(url, wanted, CONNECT_TIMEOUT).await {
        Ok(session) => session,
        Err(err) => return pending.refuse(&err.to_string()),
    };
    let Ok(mut stream) = pending.accept() else {
        return to_runtime.cancel().await;
    };
    let writer = stream.writer();
    let upstream = async {
        loop {
            match from_runtime.next().await {
                Ok(Some((channel, bytes))) => {
                    if let Err(err) = writer.send(channel, bytes).await {
                        debug!(error = %err, "stream to the cloud ended");
                        return None;
                    }
                }
                Ok(None) => return None,
                Err(err) => return Some(err.to_string()),
            }
        }
    };
    let downstream = async {
        // Once the runtime takes no more input (the command ended while
        // its input still came), the cloud's input is dropped: the
        // runtime's last words (the outcome) still come, upstream.
        let mut runtime_gone = false;
        let mut ahead = None;
        loop {
            let chunk = match ahead.take() {
                Some(chunk) => chunk,
                None => match stream.recv().await {
                    Some(chunk) => chunk,
                    None => break,
                },
            };
            let sent = match chunk {
                Ok(_) if runtime_gone => Ok(()),
                // Input followed at once by its end (piped input): sent
                // together, as one last frame (see `SpdyWriter::send_last`).
                Ok(Chunk::Data(channel, bytes)) if channel == channel::STDIN && !wanted.tty => {
                    match stream.recv().now_or_never() {
                        Some(Some(Ok(Chunk::End(end)))) if end == channel => {
                            to_runtime.send_last(channel, bytes).await
                        }
                        Some(Some(next)) => {
                            ahead = Some(next);
                            to_runtime.send(channel, bytes).await
                        }
                        Some(None) => {
                            let sent = to_runtime.send(channel, bytes).await;
                            if sent.is_ok() {
                                break;
                            }
                            sent
                        }
                        None => to_runtime.send(channel, bytes).await,
                    }
                }
                Ok(Chunk::Data(channel, bytes)) => to_runtime.send(channel, bytes).await,
                Ok(Chunk::End(channel)) if !wanted.tty => to_runtime.end(channel).await,
                Ok(Chunk::End(_)) => Ok(()),
                Err(err) => {
                    debug!(error = %err, "the cloud's side of the stream ended");
                    break;
                }
            };
            if let Err(err) = sent {
                debug!(error = %err, "the runtime takes no more input");
                runtime_gone = true;
            }
        }
    };
    let failed = tokio::select! {
        failed = upstream => failed,
        () = downstream => None,
    };
    match failed {
        Some(reason) => {
            to_runtime.cancel().await;
            stream.fail(&reason);
        }
        None => stream.close(),
    }
}

/// The runtime's streaming URL for `target` in `pod`: CRI `Exec`,
/// `Attach` or `PortForward` (a WebSocket port-forward takes its ports
/// from the CRI request; SPDY names one per stream).
async fn streaming_url(cri: &Cri, pod: &Pod, target: UpgradeTarget) -> Result<String, String> {
    let mut runtime = cri.runtime.clone();
    match target {
        UpgradeTarget::Exec {
            container,
            command,
            io,
        } => {
            let container_id = container_id(pod, &container)?;
            if command.is_empty() {
                return Err("no command to run".to_owned());
            }
            let request = api::ExecRequest {
                container_id,
                cmd: command,
                tty: io.tty,
                stdin: io.stdin,
                stdout: io.stdout,
                // With a terminal, errors come on its output.
                stderr: io.stderr && !io.tty,
            };
            match runtime.exec(request).await {
                Ok(answer) => Ok(answer.into_inner().url),
                Err(status) => Err(format!("CRI Exec: {}", status.message())),
            }
        }
        UpgradeTarget::Attach { container, io } => {
            let request = api::AttachRequest {
                container_id: container_id(pod, &container)?,
                stdin: io.stdin,
                tty: io.tty,
                stdout: io.stdout,
                stderr: io.stderr && !io.tty,
            };
            match runtime.attach(request).await {
                Ok(answer) => Ok(answer.into_inner().url),
                Err(status) => Err(format!("CRI Attach: {}", status.message())),
            }
        }
        UpgradeTarget::PortForward { ports } => {
            let uid = crate::spec::pod_uid(pod);
            let sandboxes = cri
                .sandboxes(crate::spec::POD_UID, &uid)
                .await
                .map_err(|err| err.to_string())?;
            let ready = sandboxes
                .into_iter()
                .find(|s| s.state == api::PodSandboxState::SandboxReady as i32)
                .ok_or("the pod has no running sandbox")?;
            let request = api::PortForwardRequest {
                pod_sandbox_id: ready.id,
                port: ports.into_iter().map(i32::from).collect(),
            };
            match runtime.port_forward(request).await {
                Ok(answer) => Ok(answer.into_inner().url),
                Err(status) => Err(format!("CRI PortForward: {}", status.message())),
            }
        }
    }
}

/// The most bytes of one forwarded header line.
const MAX_HEADER: usize = 8 * 1024;

/// A kubelet streaming request carried as its caller made it, as the
/// kubelet itself proxies it: the upgrade, with only its protocol headers,
/// goes to the runtime's streaming server for `target`, and from then on
/// the bytes pass unread both ways (the runtime's response head first),
/// so whichever protocol the caller speaks (SPDY/3.1, WebSocket) is the
/// runtime's to answer.
async fn upgrade(
    cri: &Cri,
    pod: &Pod,
    target: UpgradeTarget,
    method: &str,
    headers: &[(String, String)],
    pending: PendingStream,
) {
    if !matches!(method, "GET" | "POST") {
        return pending.refuse(&format!("method {method:?} cannot open a stream"));
    }
    let url = match streaming_url(cri, pod, target).await {
        Ok(url) => url,
        Err(reason) => return pending.refuse(&reason),
    };
    let Some((authority, path)) = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split_once('/'))
    else {
        return pending.refuse(&format!("a streaming URL this node cannot reach: {url}"));
    };
    let mut head = format!("{method} /{path} HTTP/1.1\r\nHost: {authority}\r\n");
    for (name, value) in headers.iter().filter(|(name, _)| is_upgrade_header(name)) {
        let clean = |text: &str| !text.contains(['\r', '\n']) && text.len() < MAX_HEADER;
        if !clean(name) || !clean(value) {
            return pending.refuse("a header this node cannot pass on");
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let connected =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(authority));
    let mut tcp = match connected.await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(err)) => return pending.refuse(&format!("the runtime's streaming server: {err}")),
        Err(_) => return pending.refuse("the runtime's streaming server did not answer"),
    };
    if let Err(err) = tokio::io::AsyncWriteExt::write_all(&mut tcp, head.as_bytes()).await {
        return pending.refuse(&format!("the runtime's streaming server: {err}"));
    }
    carry(tcp, pending, channel::STDOUT).await
}

/// The node's figures, whole, on stdout: the Summary as JSON, or the
/// resource metrics as Prometheus text.
async fn figures(stats: &StatsCollector, what: StatsKind, pending: PendingStream) {
    let summary = match stats.summary().await {
        Ok(summary) => summary,
        Err(err) => return pending.refuse(&format!("stats: {err}")),
    };
    let bytes = match what {
        StatsKind::Summary => serde_json::to_vec(&summary).unwrap_or_default(),
        StatsKind::ResourceMetrics => crate::stats::resource_metrics(&summary).into_bytes(),
    };
    let Ok(stream) = pending.accept() else {
        return;
    };
    let writer = stream.writer();
    for chunk in bytes.chunks(16 * 1024) {
        if writer
            .send(channel::STDOUT, Bytes::copy_from_slice(chunk))
            .await
            .is_err()
        {
            return;
        }
    }
    stream.close();
}

async fn logs(
    root: &std::path::Path,
    pod: &Pod,
    container: &str,
    options: LogOptions,
    pending: PendingStream,
) {
    let dir = root
        .join("pods")
        .join(crate::spec::pod_uid(pod))
        .join("logs")
        .join(container);
    crate::logs::serve(&dir, options, pending).await
}

//! The six fuzz targets. Each takes untrusted bytes the way the project
//! takes them from the network or from a user, and must never panic,
//! overflow or allocate without bound: an error is the right answer to bad
//! input. A target that finds a property broken (a decoded value that does
//! not decode again after encoding) panics, which AFL++ records as a crash.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use hub::certs::{CloudCa, ledger};
use hub::dialect::Dialect;
use stream::frame::Frame;
use transports::frame::{self, Codec, FrameDecoder};
use twin::protocol::{self, Request, StateUpdate, TwinUpdate};

/// The largest frame the frame and KubeEdge targets take: small, so an
/// announced length near it costs little per execution; the checks are
/// the same as with the default 16 MiB.
const MAX_FRAME: usize = 64 * 1024;

/// A target: its name on the command line and its function.
pub struct Target {
    /// The name (also the corpus folder's).
    pub name: &'static str,
    /// Runs one input.
    pub run: fn(&[u8]),
    /// Work done once, before AFL++'s fork server starts.
    pub prepare: fn(),
}

/// All of them.
pub const ALL: [Target; 6] = [
    Target {
        name: "frame",
        run: frame,
        prepare: nothing,
    },
    Target {
        name: "kubeedge",
        run: kubeedge,
        prepare: nothing,
    },
    Target {
        name: "twin",
        run: twin,
        prepare: nothing,
    },
    Target {
        name: "manifest",
        run: manifest,
        prepare: nothing,
    },
    Target {
        name: "join",
        run: join,
        prepare: prepare_join,
    },
    Target {
        name: "authority",
        run: authority,
        prepare: nothing,
    },
];

fn nothing() {}

/// The length-prefix codec on a byte stream (UDS, QUIC streams) as a peer
/// sends it: every frame split off is decoded as the link decodes it
/// (MessagePack, or a stream tunnel frame), and what is left at the end of
/// the stream is judged.
fn frame(data: &[u8]) {
    let decoder = FrameDecoder::new(MAX_FRAME);
    let mut buf = BytesMut::from(data);
    loop {
        match decoder.decode(&mut buf) {
            Ok(Some(payload)) => {
                assert!(payload.len() <= MAX_FRAME, "a frame over the maximum");
                if let Ok(msg) = Codec::MessagePack.decode(&payload) {
                    // What was read is sent on unchanged elsewhere.
                    let again =
                        frame::encode(&msg, usize::MAX).expect("a decoded message encodes again");
                    frame::decode(&again).expect("an encoded message decodes again");
                }
                if let Ok(tunnel) = Frame::decode(&payload) {
                    let again = Frame::decode(&tunnel.encode()).expect("a tunnel frame round trip");
                    assert_eq!(again, tunnel, "a tunnel frame changed on its round trip");
                }
            }
            Ok(None) => break,
            Err(_) => return,
        }
        // The buffer never grows past one frame because of a length a peer announced.
        assert!(buf.capacity() <= data.len().max(MAX_FRAME + frame::LENGTH_PREFIX) * 2);
    }
    let _ = decoder.finish(&buf);
}

/// One KubeEdge JSON frame from a KubeEdge peer, then what the cloud does
/// with a message from a KubeEdge edge (its kind, its form for the cloud's
/// modules) and what the edge does before sending one up.
fn kubeedge(data: &[u8]) {
    let Ok(msg) = transports::kubeedge::decode(data, MAX_FRAME) else {
        return;
    };
    let encoded = transports::kubeedge::encode(&msg);
    transports::kubeedge::decode(&encoded, usize::MAX)
        .expect("a decoded KubeEdge message decodes again after encoding");
    let _ = Codec::KubeEdgeJson.encode(&msg, MAX_FRAME);
    let dialect = Dialect::KubeEdge;
    let _ = dialect.kind(&msg);
    let _ = dialect.ack(&msg);
    let _ = dialect.upstream(msg.clone());
    let _ = dialect.to_cloud_modules(msg);
}

/// An MQTT message from a mapper or an edge application: `topic`, a NUL
/// byte, then the payload (a topic holds no NUL). The eventbus turns the
/// payload into content; devicetwin reads the request the topic names.
fn twin(data: &[u8]) {
    let (topic, payload) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(topic) = std::str::from_utf8(topic) else {
        return;
    };
    let _ = protocol::result_topic(topic);
    let content = protocol::content_of(payload);
    let event = protocol::event_id_of(&content);
    let Some(request) = Request::of(topic) else {
        return;
    };
    let _ = request.result_topic();
    match request {
        Request::TwinUpdate(_) => {
            if let Ok(update) = protocol::read::<TwinUpdate>(&content)
                && protocol::check_twin_update(&update).is_ok()
            {
                serde_json::to_vec(&update).expect("a twin update serializes");
            }
        }
        Request::StateUpdate(_) => {
            if let Ok(update) = protocol::read::<StateUpdate>(&content) {
                let _ = protocol::check_state_update(&update);
            }
        }
        _ => {}
    }
    let _ = protocol::error_result(&event, protocol::code::BAD_REQUEST, "fuzz");
}

/// A manifest posted to the admin API's apply or delete.
fn manifest(data: &[u8]) {
    let _ = apis::manifest::parse(data);
}

/// The fuzz CA, committed beside this crate (it signs nothing real).
static CA: OnceLock<CloudCa> = OnceLock::new();

fn ca() -> &'static CloudCa {
    CA.get_or_init(|| {
        CloudCa::from_pem(include_str!("../ca/ca.crt"), include_str!("../ca/ca.key"))
            .expect("the fuzz CA loads")
    })
}

fn prepare_join() {
    ca();
}

/// A join at the certificate endpoint: the `Authorization` header, a NUL,
/// the `NodeName` header (empty: not sent), a NUL, then the CSR (DER or
/// PEM, the request's body). As the endpoint does: the token's signature
/// and claims, the CSR's node name, the token's admission for that node,
/// then the certificate signed. The CSR is read and signed whatever the
/// token, so a CSR's parsing is fuzzed without forging a token (a node
/// holding a valid token sends any CSR it likes).
fn join(data: &[u8]) {
    let mut parts = data.splitn(3, |b| *b == 0);
    let authorization = parts.next().unwrap_or_default();
    let named = parts.next().unwrap_or_default();
    let csr = parts.next().unwrap_or_default();
    let named = std::str::from_utf8(named).ok().filter(|n| !n.is_empty());
    let ca = ca();
    let claims = ca.verify_bearer(Some(authorization));
    let Ok(node) = CloudCa::csr_node(csr) else {
        return;
    };
    let now = SystemTime::now();
    let unix = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    if let Ok(claims) = &claims {
        let _ = ledger::admit(claims, None, false, &node, unix);
    }
    if let Ok((signed, cert)) =
        ca.sign_csr_at(csr, now, now + Duration::from_secs(3600), None, named)
    {
        assert_eq!(signed, node, "the signed node is the CSR's");
        assert!(hub::certs::issued_at(cert.as_ref()).is_some());
    }
}

/// A gRPC client's bytes to an edge's DMI socket, through the HTTP/2
/// authority rewriter (`twin::dmi::authority`): the first byte is the size
/// of each socket read (0: one read), the rest the bytes. What reaches the
/// server is whole frames after the preface, none over the rewriter's
/// limits, or the bytes as they came when they are not HTTP/2.
fn authority(data: &[u8]) {
    let Some((&read, bytes)) = data.split_first() else {
        return;
    };
    let read = if read == 0 {
        bytes.len().max(1)
    } else {
        usize::from(read)
    };
    let Ok(output) = twin::dmi::authority::rewrite_reads(bytes.chunks(read)) else {
        return;
    };
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let Some(mut rest) = output.strip_prefix(PREFACE) else {
        assert!(
            bytes.starts_with(&output) || output.is_empty(),
            "bytes that are not HTTP/2 pass as they came"
        );
        return;
    };
    while !rest.is_empty() {
        assert!(rest.len() >= 9, "a frame header cut short");
        let length =
            (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        assert!(length <= 64 * 1024, "a frame of {length} bytes passed");
        assert!(rest.len() >= 9 + length, "a frame cut short");
        rest = &rest[9 + length..];
    }
}

/// The seeds of each target, written into `corpus/<target>/`.
pub mod seeds {
    use super::*;
    use beehive::Message;
    use hub::certs::TokenSpec;
    use serde_json::json;
    use std::path::Path;

    fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dir = dir.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)
    }

    fn length_prefixed(payloads: &[&[u8]]) -> Vec<u8> {
        let mut buf = BytesMut::new();
        for payload in payloads {
            frame::put_length_prefixed(&mut buf, payload);
        }
        buf.to_vec()
    }

    /// Writes every target's seeds under `dir`.
    pub fn write_all(dir: &Path) -> std::io::Result<()> {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": "4711"},
            "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "busybox"}]}});
        let insert = Message::new()
            .build_router("edgecontroller", "resource", "default/pod/web", "insert")
            .with_content(apis::kinds::object_content(&pod));
        let ack = Message::new()
            .build_router("metamanager", "resource", "default/pod/web", "response")
            .with_content("OK");
        let keepalive = Message::new()
            .build_router("edgehub", "hub", "node", "keepalive")
            .with_content(beehive::Content::Empty);
        let insert_bytes = frame::encode(&insert, usize::MAX).map_err(std::io::Error::other)?;
        let ack_bytes = frame::encode(&ack, usize::MAX).map_err(std::io::Error::other)?;
        let keepalive_bytes =
            frame::encode(&keepalive, usize::MAX).map_err(std::io::Error::other)?;
        write(dir, "frame", "insert", &length_prefixed(&[&insert_bytes]))?;
        write(
            dir,
            "frame",
            "three",
            &length_prefixed(&[&keepalive_bytes, &ack_bytes, &insert_bytes]),
        )?;
        let mut truncated = length_prefixed(&[&ack_bytes]);
        truncated.truncate(truncated.len() - 3);
        write(dir, "frame", "truncated", &truncated)?;
        let tunnel: Vec<Bytes> = vec![
            Frame::Open {
                id: 7,
                request: Bytes::from_static(br#"{"kind":"logs","pod":"default/web"}"#),
            }
            .encode(),
            Frame::Data {
                id: 7,
                channel: 1,
                bytes: Bytes::from_static(b"hello\n"),
            }
            .encode(),
            Frame::Credit {
                id: 7,
                bytes: 65536,
            }
            .encode(),
            Frame::End { id: 7, channel: 0 }.encode(),
            Frame::Close {
                id: 7,
                reason: "done".to_owned(),
            }
            .encode(),
        ];
        let tunnel: Vec<&[u8]> = tunnel.iter().map(|b| b.as_ref()).collect();
        write(dir, "frame", "tunnel", &length_prefixed(&tunnel))?;

        // KubeEdge's wire form, as transports' tests write it.
        let kubeedge = [
            (
                "insert",
                json!({"header": {"msg_id": "2f1c3e1a-6a43-4f7e-9d7c-4a3c2b1d0e9f",
                    "timestamp": 1_700_000_000_123_i64, "resourceversion": "4711"},
                    "route": {"source": "edgecontroller", "group": "resource",
                        "operation": "insert", "resource": "default/pod/web"},
                    "content": pod}),
            ),
            (
                "ack",
                json!({"header": {"msg_id": "7b0c9d8e-1f2a-4b3c-8d4e-5f6a7b8c9d0e",
                    "parent_msg_id": "2f1c3e1a-6a43-4f7e-9d7c-4a3c2b1d0e9f",
                    "timestamp": 1_700_000_000_456_i64, "sync": true},
                    "route": {"source": "metaManager", "group": "resource",
                        "operation": "response", "resource": "default/pod/web"},
                    "content": "OK"}),
            ),
            (
                "keepalive",
                json!({"header": {"msg_id": "00000000-0000-4000-8000-000000000001", "timestamp": 1},
                    "route": {"source": "websocket", "group": "resource", "resource": "node",
                        "operation": "keepalive"},
                    "content": "ping"}),
            ),
            (
                "podstatus-bytes",
                json!({"header": {"msg_id": "00000000-0000-4000-8000-000000000002", "timestamp": 1},
                    "route": {"source": "edged", "group": "meta", "operation": "update",
                        "resource": "default/podstatus/web"},
                    "content": "eyJwaGFzZSI6IlJ1bm5pbmcifQ=="}),
            ),
            (
                "nodestatus",
                json!({"header": {"msg_id": "00000000-0000-4000-8000-000000000003", "timestamp": 2},
                    "route": {"source": "edged", "group": "meta", "operation": "update",
                        "resource": "default/nodestatus/edge-1"},
                    "content": {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}}),
            ),
        ];
        for (name, value) in kubeedge {
            write(dir, "kubeedge", name, value.to_string().as_bytes())?;
        }

        // KubeEdge's device MQTT protocol, as mappers publish it.
        let twin = [
            (
                "twin-update",
                "$hw/events/device/thermo-1/twin/update",
                json!({"event_id": "e1", "timestamp": 1_700_000_000_000_i64,
                    "twin": {"temperature": {"actual": {"value": "21.5",
                        "metadata": {"timestamp": 1_700_000_000_000_i64}},
                        "metadata": {"type": "float"}}}}),
            ),
            (
                "twin-delete",
                "$hw/events/device/thermo-1/twin/update",
                json!({"event_id": "e2", "timestamp": 1,
                    "twin": {"humidity": {"metadata": {"type": "deleted"}}}}),
            ),
            (
                "twin-expected",
                "$hw/events/device/thermo-1/twin/update",
                json!({"event_id": "e3", "timestamp": 1,
                    "twin": {"setpoint": {"expected": {"value": "20"}, "optional": false}}}),
            ),
            (
                "twin-get",
                "$hw/events/device/thermo-1/twin/get",
                json!({"event_id": "e4", "timestamp": 1}),
            ),
            (
                "state-update",
                "$hw/events/device/thermo-1/state/update",
                json!({"event_id": "e5", "timestamp": 1, "state": "online"}),
            ),
            (
                "membership-get",
                "$hw/events/node/edge-1/membership/get",
                json!({"event_id": "e6", "timestamp": 1}),
            ),
            ("connected", "$hw/events/connected/thermo-1", json!(null)),
        ];
        for (name, topic, payload) in twin {
            let mut bytes = topic.as_bytes().to_vec();
            bytes.push(0);
            if !payload.is_null() {
                bytes.extend_from_slice(payload.to_string().as_bytes());
            }
            write(dir, "twin", name, &bytes)?;
        }
        write(
            dir,
            "twin",
            "not-json",
            b"$hw/events/device/thermo-1/twin/update\x00online",
        )?;

        // Manifests as edgehivectl applies them (the admin API's tests' forms).
        let manifests: [(&str, &str); 4] = [
            (
                "pod-and-configmap.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  nodeName: edge-1\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'sleep 1d']\n  volumes:\n  - name: config\n    configMap: {name: a}\n",
            ),
            (
                "list.json",
                r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"dg=="}},{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"ports":[{"port":80}]}}]}"#,
            ),
            (
                "device.yaml",
                "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: thermometer\nspec:\n  properties:\n  - name: temperature\n    type: FLOAT\n---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: thermo-1\nspec:\n  deviceModelRef:\n    name: thermometer\n  nodeName: edge-1\n  properties:\n  - name: temperature\n",
            ),
            (
                "endpoints.yaml",
                "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: web\nsubsets:\n- addresses:\n  - ip: 10.0.0.1\n  ports:\n  - port: 80\n",
            ),
        ];
        for (name, text) in manifests {
            write(dir, "manifest", name, text.as_bytes())?;
        }

        // A join as an edge sends it: a token bound to its node, a CSR.
        let ca = ca();
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let (_, bound) = ca.issue_restricted_token(&TokenSpec {
            ttl: century,
            node: Some("edge-1".to_owned()),
            single_use: false,
        });
        let plain = ca.issue_token(century);
        let key = rcgen::KeyPair::generate().map_err(std::io::Error::other)?;
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "edge-1");
        let csr = params
            .serialize_request(&key)
            .map_err(std::io::Error::other)?;
        let mut kubeedge_params = rcgen::CertificateParams::default();
        kubeedge_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:edge-2");
        kubeedge_params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let kubeedge_csr = kubeedge_params
            .serialize_request(&key)
            .map_err(std::io::Error::other)?;
        let join = |token: &str, named: &str, csr: &[u8]| {
            let mut bytes = format!("Bearer {token}\0{named}\0").into_bytes();
            bytes.extend_from_slice(csr);
            bytes
        };
        // KubeEdge's edges send the JWT alone.
        let jwt = plain
            .split_once('.')
            .map(|(_, jwt)| jwt)
            .unwrap_or_default();
        write(dir, "join", "bound-der", &join(&bound, "edge-1", csr.der()))?;
        write(
            dir,
            "join",
            "plain-pem",
            &join(
                &plain,
                "",
                csr.pem().map_err(std::io::Error::other)?.as_bytes(),
            ),
        )?;
        write(
            dir,
            "join",
            "kubeedge-jwt",
            &join(jwt, "edge-2", kubeedge_csr.der()),
        )?;
        write(
            dir,
            "join",
            "wrong-node",
            &join(&bound, "edge-9", csr.der()),
        )?;

        // gRPC requests as grpc-go writes them on a Unix socket (its path
        // as the authority): the preface, SETTINGS, HEADERS, DATA.
        let grpc = |authority: &[u8], read: u8, continued: bool| {
            let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
            for (indexing, name, value) in [
                (
                    0x00,
                    &b":path"[..],
                    &b"/v1beta1.DeviceManagerService/MapperRegister"[..],
                ),
                (0x40, b":authority", authority), // indexed: the next request refers to it
                (0x00, b"content-type", b"application/grpc"),
                (0x00, b"te", b"trailers"),
            ] {
                block.extend_from_slice(&[indexing, name.len() as u8]);
                block.extend_from_slice(name);
                block.push(value.len() as u8);
                block.extend_from_slice(value);
            }
            let frame = |kind: u8, flags: u8, stream: u8, payload: &[u8]| {
                let mut out = vec![
                    0,
                    (payload.len() >> 8) as u8,
                    payload.len() as u8,
                    kind,
                    flags,
                ];
                out.extend_from_slice(&[0, 0, 0, stream]);
                out.extend_from_slice(payload);
                out
            };
            let mut out = vec![read];
            out.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
            out.extend(frame(0x4, 0, 0, &[]));
            if continued {
                let (first, rest) = block.split_at(block.len() / 2);
                out.extend(frame(0x1, 0, 1, first));
                out.extend(frame(0x9, 0x4, 1, rest));
            } else {
                out.extend(frame(0x1, 0x4, 1, &block));
            }
            out.extend(frame(0x0, 0x1, 1, b"\0\0\0\0\0"));
            // A second request naming the authority from the table (62).
            out.extend(frame(0x1, 0x4, 3, &[0x83, 0x86, 0x84, 0xbe]));
            out
        };
        write(
            dir,
            "authority",
            "grpc-go",
            &grpc(b"/etc/kubeedge/dmi.sock", 0, false),
        )?;
        write(
            dir,
            "authority",
            "grpc-go-reads",
            &grpc(b"/etc/kubeedge/dmi.sock", 7, true),
        )?;
        write(dir, "authority", "localhost", &grpc(b"localhost", 0, false))?;
        write(
            dir,
            "authority",
            "http1",
            b"\0GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        )?;
        check(dir)
    }

    /// The seeds reach past the first check of each target (a seed that
    /// is refused at once teaches the fuzzer little).
    fn check(dir: &Path) -> std::io::Result<()> {
        let failed = |what: String| Err(std::io::Error::other(what));
        for entry in std::fs::read_dir(dir.join("kubeedge"))? {
            let path = entry?.path();
            if let Err(err) = transports::kubeedge::decode(&std::fs::read(&path)?, MAX_FRAME) {
                return failed(format!("{}: {err}", path.display()));
            }
        }
        for entry in std::fs::read_dir(dir.join("manifest"))? {
            let path = entry?.path();
            // A regression seed is a bug's input: refused is right.
            if path.to_string_lossy().contains("regression") {
                continue;
            }
            if let Err(err) = apis::manifest::parse(&std::fs::read(&path)?) {
                return failed(format!("{}: {err}", path.display()));
            }
        }
        for entry in std::fs::read_dir(dir.join("join"))? {
            let path = entry?.path();
            let data = std::fs::read(&path)?;
            let mut parts = data.splitn(3, |b| *b == 0);
            let token = ca().verify_bearer(parts.next());
            let node = CloudCa::csr_node(parts.nth(1).unwrap_or_default());
            if let Err(err) = token.as_ref().map(drop).and(node.as_ref().map(drop)) {
                return failed(format!("{}: {err}", path.display()));
            }
        }
        for entry in std::fs::read_dir(dir.join("authority"))? {
            let path = entry?.path();
            let data = std::fs::read(&path)?;
            let read = usize::from(data.first().copied().unwrap_or_default()).max(1);
            let bytes = data.get(1..).unwrap_or_default();
            if let Err(err) = twin::dmi::authority::rewrite_reads(bytes.chunks(read)) {
                return failed(format!("{}: {err}", path.display()));
            }
        }
        for entry in std::fs::read_dir(dir.join("twin"))? {
            let path = entry?.path();
            let data = std::fs::read(&path)?;
            let topic = data.split(|b| *b == 0).next().unwrap_or_default();
            if Request::of(&String::from_utf8_lossy(topic)).is_none() {
                return failed(format!("{}: not a request topic", path.display()));
            }
        }
        Ok(())
    }
}

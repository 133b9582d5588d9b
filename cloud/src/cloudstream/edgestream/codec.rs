//! KubeEdge's edgestream wire format, as plain functions.
//!
//! One WebSocket message is one tunnel message: the connection id as a
//! uvarint, the message type as a uvarint, then the data (to the end of
//! the WebSocket message). A connection is opened by the cloud with an
//! `XConnect` message whose data is the JSON of KubeEdge's
//! `EdgedLogsConnection` / `EdgedExecConnection` / ... : the request the
//! edge makes to its local kubelet server (`url` as Go's `url.URL`
//! marshals it, `header` as `http.Header`, `method` for exec and attach).

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The most data one message carries: KubeEdge's edge reads at most 1 MiB
/// of a message's data (`MaxRespBodyLength`).
pub const MAX_DATA: usize = 1 << 20;

/// The most bytes of one whole message (two uvarints of 10 bytes at most,
/// then the data).
pub const MAX_MESSAGE: usize = MAX_DATA + 20;

/// Where KubeEdge's edge finds its local kubelet server (the cloud names
/// it in every connection; the edge dials what it is told).
pub const EDGED_SERVER: &str = "127.0.0.1:10350";

/// A tunnel message's type (KubeEdge's `MessageType`, numbered as there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// Opens a container log (cloud to edge).
    LogsConnect,
    /// Opens an exec upgrade (cloud to edge).
    ExecConnect,
    /// Opens a stats or metrics request (cloud to edge).
    MetricConnect,
    /// Bytes of an open connection (both ways).
    Data,
    /// Ends one connection (both ways).
    RemoveConnect,
    /// Ends the whole tunnel, the data saying why (cloud to edge).
    CloseConnect,
    /// Opens an attach upgrade (cloud to edge).
    AttachConnect,
}

impl MessageType {
    /// Its number on the wire.
    pub fn number(self) -> u64 {
        match self {
            MessageType::LogsConnect => 0,
            MessageType::ExecConnect => 1,
            MessageType::MetricConnect => 2,
            MessageType::Data => 3,
            MessageType::RemoveConnect => 4,
            MessageType::CloseConnect => 5,
            MessageType::AttachConnect => 6,
        }
    }

    /// The type numbered `number`.
    pub fn from_number(number: u64) -> Option<MessageType> {
        Some(match number {
            0 => MessageType::LogsConnect,
            1 => MessageType::ExecConnect,
            2 => MessageType::MetricConnect,
            3 => MessageType::Data,
            4 => MessageType::RemoveConnect,
            5 => MessageType::CloseConnect,
            6 => MessageType::AttachConnect,
            _ => return None,
        })
    }
}

/// One tunnel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The connection it belongs to (the cloud numbers them).
    pub connect_id: u64,
    /// What it is.
    pub kind: MessageType,
    /// Its data.
    pub data: Bytes,
}

impl Message {
    /// A message of `kind` for connection `connect_id`.
    pub fn new(connect_id: u64, kind: MessageType, data: impl Into<Bytes>) -> Message {
        Message {
            connect_id,
            kind,
            data: data.into(),
        }
    }
}

/// A message that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The message ends inside a uvarint.
    #[error("the message ends inside its {0}")]
    Truncated(&'static str),
    /// A uvarint longer than 64 bits.
    #[error("the message's {0} overflows 64 bits")]
    Overflow(&'static str),
    /// A message type KubeEdge does not have.
    #[error("unknown message type {0}")]
    UnknownType(u64),
    /// Larger than [`MAX_MESSAGE`]; refused before it is read.
    #[error("a message of {size} bytes exceeds the {max} byte limit")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
}

/// Appends `value` as a uvarint (Go's `binary.PutUvarint`).
pub fn put_uvarint(buffer: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        buffer.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    buffer.put_u8(value as u8);
}

/// Reads a uvarint at the start of `bytes` (Go's `binary.ReadUvarint`):
/// the value and how many bytes it took.
pub fn read_uvarint(bytes: &[u8], what: &'static str) -> Result<(u64, usize), CodecError> {
    let mut value: u64 = 0;
    for (index, byte) in bytes.iter().enumerate() {
        if index == 10 {
            return Err(CodecError::Overflow(what));
        }
        if *byte < 0x80 {
            // The tenth byte holds bit 63 only.
            if index == 9 && *byte > 1 {
                return Err(CodecError::Overflow(what));
            }
            return Ok((value | (u64::from(*byte) << (7 * index)), index + 1));
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
    }
    if bytes.len() >= 10 {
        return Err(CodecError::Overflow(what));
    }
    Err(CodecError::Truncated(what))
}

/// `message` on the wire.
pub fn encode(message: &Message) -> Bytes {
    let mut buffer = BytesMut::with_capacity(message.data.len() + 4);
    put_uvarint(&mut buffer, message.connect_id);
    put_uvarint(&mut buffer, message.kind.number());
    buffer.extend_from_slice(&message.data);
    buffer.freeze()
}

/// The message `frame` (one whole WebSocket message) carries.
pub fn decode(frame: Bytes) -> Result<Message, CodecError> {
    if frame.len() > MAX_MESSAGE {
        return Err(CodecError::TooLarge {
            size: frame.len(),
            max: MAX_MESSAGE,
        });
    }
    let (connect_id, first) = read_uvarint(&frame, "connection id")?;
    let (number, second) = read_uvarint(&frame[first..], "message type")?;
    let kind = MessageType::from_number(number).ok_or(CodecError::UnknownType(number))?;
    Ok(Message {
        connect_id,
        kind,
        data: frame.slice(first + second..),
    })
}

/// Go's `url.URL` as `encoding/json` writes it (every exported field, by
/// its Go name; `User` a nil pointer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GoUrl {
    /// `http`.
    pub scheme: String,
    /// Unused.
    pub opaque: String,
    /// Always `null`.
    pub user: Option<()>,
    /// host:port.
    pub host: String,
    /// The path, decoded.
    pub path: String,
    /// The path as escaped, when that is not the default escaping.
    pub raw_path: String,
    /// Unused.
    pub omit_host: bool,
    /// Unused.
    pub force_query: bool,
    /// The query, as escaped, without `?`.
    pub raw_query: String,
    /// Unused.
    pub fragment: String,
    /// Unused.
    pub raw_fragment: String,
}

/// The request the edge is asked to make to its local kubelet server
/// (KubeEdge's `EdgedLogsConnection`, `EdgedExecConnection`,
/// `EdgedAttachConnection`, `EdgedMetricsConnection` in JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgedRequest {
    /// The connection id (Go's `MessID`, untagged).
    #[serde(rename = "MessID")]
    pub id: u64,
    /// Where.
    pub url: GoUrl,
    /// Its headers, names in Go's canonical form.
    pub header: BTreeMap<String, Vec<String>>,
    /// The method (exec and attach only: the others are GETs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

impl EdgedRequest {
    /// A request for `raw_path`?`raw_query` (as the caller sent them,
    /// escaped) on the edge's local kubelet server, with `headers`
    /// (`Host` left out: the edge's HTTP client names its own).
    pub fn new<'a>(
        id: u64,
        raw_path: &str,
        raw_query: &str,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        method: Option<&str>,
    ) -> EdgedRequest {
        let path = percent_encoding::percent_decode_str(raw_path)
            .decode_utf8_lossy()
            .into_owned();
        let raw_path = if path == raw_path {
            String::new()
        } else {
            raw_path.to_owned()
        };
        let mut header: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("host") {
                continue;
            }
            header
                .entry(canonical_header(name))
                .or_default()
                .push(value.to_owned());
        }
        EdgedRequest {
            id,
            url: GoUrl {
                scheme: "http".to_owned(),
                host: EDGED_SERVER.to_owned(),
                path,
                raw_path,
                raw_query: raw_query.to_owned(),
                ..GoUrl::default()
            },
            header,
            method: method.map(str::to_owned),
        }
    }

    /// Its JSON, as the data of an `XConnect` message.
    pub fn to_json(&self) -> Bytes {
        // A struct of strings, maps and numbers always serializes.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// `name` in Go's canonical header form (`x-stream-protocol-version` ->
/// `X-Stream-Protocol-Version`), as Go's `http.Header` keys are: the edge
/// sets and reads headers through that form.
pub fn canonical_header(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_for_every_type() {
        for number in 0..=6 {
            let kind = MessageType::from_number(number).expect("a KubeEdge type");
            assert_eq!(kind.number(), number);
            for id in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
                let message = Message::new(id, kind, Bytes::from_static(b"\x00\xffdata"));
                assert_eq!(decode(encode(&message)), Ok(message));
            }
        }
        assert_eq!(MessageType::from_number(7), None);
    }

    #[test]
    fn the_bytes_are_go_s() {
        // binary.PutUvarint(300) = ac 02; LogsConnect = 0, Data = 3.
        let message = Message::new(300, MessageType::Data, Bytes::from_static(b"hi"));
        assert_eq!(&encode(&message)[..], b"\xac\x02\x03hi");
        let message = Message::new(1, MessageType::LogsConnect, Bytes::new());
        assert_eq!(&encode(&message)[..], b"\x01\x00");
        // u64::MAX takes ten bytes, the last one 0x01.
        let mut buffer = BytesMut::new();
        put_uvarint(&mut buffer, u64::MAX);
        assert_eq!(buffer.len(), 10);
        assert_eq!(buffer[9], 1);
        assert_eq!(read_uvarint(&buffer, "x"), Ok((u64::MAX, 10)));
    }

    #[test]
    fn uvarint_edges() {
        assert_eq!(read_uvarint(&[0], "x"), Ok((0, 1)));
        assert_eq!(read_uvarint(&[0x7f, 0xff], "x"), Ok((127, 1)));
        assert_eq!(read_uvarint(&[0x80, 0x01], "x"), Ok((128, 2)));
        assert_eq!(read_uvarint(&[], "x"), Err(CodecError::Truncated("x")));
        assert_eq!(read_uvarint(&[0x80], "x"), Err(CodecError::Truncated("x")));
        // A tenth byte above 1 overflows; so does an eleventh byte.
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert_eq!(read_uvarint(&too_big, "x"), Err(CodecError::Overflow("x")));
        assert_eq!(
            read_uvarint(&[0xff; 11], "x"),
            Err(CodecError::Overflow("x"))
        );
        assert_eq!(
            read_uvarint(&[0x80; 10], "x"),
            Err(CodecError::Overflow("x"))
        );
    }

    #[test]
    fn garbled_and_oversized_messages_are_refused() {
        assert_eq!(
            decode(Bytes::new()),
            Err(CodecError::Truncated("connection id"))
        );
        assert_eq!(
            decode(Bytes::from_static(b"\x05")),
            Err(CodecError::Truncated("message type"))
        );
        assert_eq!(
            decode(Bytes::from_static(b"\x05\x09data")),
            Err(CodecError::UnknownType(9))
        );
        let big = Bytes::from(vec![3u8; MAX_MESSAGE + 1]);
        assert_eq!(
            decode(big),
            Err(CodecError::TooLarge {
                size: MAX_MESSAGE + 1,
                max: MAX_MESSAGE
            })
        );
        // The largest allowed reads.
        let mut whole = BytesMut::new();
        put_uvarint(&mut whole, 7);
        put_uvarint(&mut whole, 3);
        whole.extend_from_slice(&vec![b'x'; MAX_DATA]);
        assert_eq!(decode(whole.freeze()).map(|m| m.data.len()), Ok(MAX_DATA));
        // Any bytes at all either read or are refused, never panic.
        let mut seed = 7u64;
        for _ in 0..2_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (seed >> 59) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (seed >> (i % 56)) as u8).collect();
            let _ = decode(Bytes::from(bytes));
        }
    }

    #[test]
    fn a_connection_is_the_json_go_writes() {
        let request = EdgedRequest::new(
            4,
            "/exec/default/web/main",
            "command=sh&input=1",
            [
                ("x-stream-protocol-version", "v4.channel.k8s.io"),
                ("x-stream-protocol-version", "v3.channel.k8s.io"),
                ("upgrade", "SPDY/3.1"),
                ("host", "cloud:10352"),
            ],
            Some("POST"),
        );
        let json: serde_json::Value = serde_json::from_slice(&request.to_json()).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({
                "MessID": 4,
                "url": {
                    "Scheme": "http", "Opaque": "", "User": null, "Host": "127.0.0.1:10350",
                    "Path": "/exec/default/web/main", "RawPath": "", "OmitHost": false,
                    "ForceQuery": false, "RawQuery": "command=sh&input=1",
                    "Fragment": "", "RawFragment": ""
                },
                "header": {
                    "Upgrade": ["SPDY/3.1"],
                    "X-Stream-Protocol-Version": ["v4.channel.k8s.io", "v3.channel.k8s.io"]
                },
                "method": "POST"
            })
        );
        // Logs carry no method; an escaped path keeps its escaping.
        let logs = EdgedRequest::new(1, "/containerLogs/a/b%2Dc/d", "", [], None);
        let json: serde_json::Value = serde_json::from_slice(&logs.to_json()).expect("JSON");
        assert!(json.get("method").is_none());
        assert_eq!(json["url"]["Path"], "/containerLogs/a/b-c/d");
        assert_eq!(json["url"]["RawPath"], "/containerLogs/a/b%2Dc/d");
        assert_eq!(canonical_header("sec-websocket-KEY"), "Sec-Websocket-Key");
    }
}

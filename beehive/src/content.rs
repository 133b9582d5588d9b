//! What a message carries: nothing, a line of text, or a document, an
//! encoded object or answer that the module which reads it decodes into
//! its own type.
//!
//! KubeEdge's content is Go's `interface{}`; edgehive's used to be a
//! `serde_json::Value`, a tree any module could poke at by key. Here the
//! middle of the system holds a [`Document`], the MessagePack encoding of
//! the body (maps with named fields, as a JSON object would be), shared
//! between the clones of a message and passed on unopened by the modules
//! that only route or store it. A module that reads a body says as what:
//! [`Content::decode`] into a pod, a status, a device, a write's answer.
//! The two wire forms write a content as the value it encodes (MessagePack
//! on edgehive's own link, JSON on KubeEdge's), as they wrote the tree:
//! queues and stores written by an older build read back. (An object from
//! the API server keeps its keys sorted as the tree did; a typed body is
//! written in its fields' order.)

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Error as _, Serialize, Serializer};

use crate::message::MessageError;

/// A message's body.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Content {
    /// No body (JSON `null`).
    #[default]
    Empty,
    /// A string body: `"OK"`, `"ping"`, a node's name, a refusal's reason.
    Text(String),
    /// Any other body, encoded.
    Document(Document),
}

/// One encoded body: its MessagePack bytes, shared by every clone. Two
/// documents are equal when their encodings are (the same map with its
/// keys in another order is another document).
#[derive(Clone, PartialEq, Eq)]
pub struct Document(Arc<[u8]>);

impl Content {
    /// `body` as a content: `None`/unit is [`Content::Empty`], a string is
    /// [`Content::Text`], anything else a [`Document`].
    pub fn of<T: Serialize + ?Sized>(body: &T) -> Result<Content, MessageError> {
        Ok(Content::from_encoded(encode(body)?))
    }

    /// A string body.
    pub fn text(text: impl Into<String>) -> Content {
        Content::Text(text.into())
    }

    /// Reads the body as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, MessageError> {
        match self {
            // Read through the same decoder as a document, so that empty
            // and text read as `null` and a string do (as an `Option`, a
            // newtype, a `Value`).
            Content::Empty => decode(&[NIL]),
            Content::Text(text) => decode(&encode(text.as_str())?),
            Content::Document(document) => document.decode(),
        }
    }

    /// The text of a string body.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(text) => Some(text),
            _ => None,
        }
    }

    /// Whether there is no body.
    pub fn is_empty(&self) -> bool {
        matches!(self, Content::Empty)
    }

    /// The size of the body as it is held, in bytes.
    pub fn len(&self) -> usize {
        match self {
            Content::Empty => 0,
            Content::Text(text) => text.len(),
            Content::Document(document) => document.len(),
        }
    }

    /// The body as compact JSON text, for people and logs.
    pub fn to_json(&self) -> String {
        let mut out = Vec::new();
        let mut json = serde_json::Serializer::new(&mut out);
        match self.serialize(&mut json) {
            Ok(()) => String::from_utf8(out).unwrap_or_default(),
            Err(err) => format!("<unreadable body: {err}>"),
        }
    }

    /// Appends its MessagePack encoding to `out`: a document's bytes as
    /// they are held.
    pub(crate) fn append_msgpack(
        &self,
        out: &mut Vec<u8>,
    ) -> Result<(), rmp::encode::ValueWriteError> {
        match self {
            Content::Empty => rmp::encode::write_nil(out)
                .map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite),
            Content::Text(text) => rmp::encode::write_str(out, text),
            Content::Document(document) => {
                out.extend_from_slice(&document.0);
                Ok(())
            }
        }
    }

    /// Sorts encoded bytes into the three cases, so that a body reads the
    /// same whichever way it was made.
    fn from_encoded(bytes: Vec<u8>) -> Content {
        match bytes.first() {
            None | Some(&NIL) => Content::Empty,
            Some(0xa0..=0xbf | 0xd9..=0xdb) => match rmp_serde::from_slice::<String>(&bytes) {
                Ok(text) => Content::Text(text),
                Err(_) => Content::Document(Document(bytes.into())),
            },
            Some(_) => Content::Document(Document(bytes.into())),
        }
    }
}

impl Document {
    /// Reads the document as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, MessageError> {
        decode(&self.0)
    }

    /// Whether it encodes a map (a JSON object), the only shape a struct
    /// is read from (MessagePack's decoder also builds one from a list).
    pub fn is_map(&self) -> bool {
        matches!(self.0.first(), Some(0x80..=0x8f | 0xde | 0xdf))
    }

    /// Its MessagePack bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds no bytes (a document never does).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// MessagePack's `nil`.
const NIL: u8 = 0xc0;

/// `body` in MessagePack: maps with named fields, and types that have a
/// text form (a UUID, an address, a time) written as that text, as JSON
/// would have them.
fn encode<T: Serialize + ?Sized>(body: &T) -> Result<Vec<u8>, MessageError> {
    let mut bytes = Vec::new();
    let mut writer = rmp_serde::Serializer::new(&mut bytes)
        .with_struct_map()
        .with_human_readable();
    body.serialize(&mut writer).map_err(MessageError::Encode)?;
    Ok(bytes)
}

/// `bytes` read as `T`, text forms as [`encode`] writes them.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, MessageError> {
    let mut reader = rmp_serde::Deserializer::from_read_ref(bytes).with_human_readable();
    T::deserialize(&mut reader).map_err(|err| MessageError::Read(err.to_string()))
}

impl From<&str> for Content {
    fn from(text: &str) -> Content {
        Content::Text(text.to_owned())
    }
}

impl From<String> for Content {
    fn from(text: String) -> Content {
        Content::Text(text)
    }
}

impl From<Document> for Content {
    fn from(document: Document) -> Content {
        Content::Document(document)
    }
}

impl From<()> for Content {
    fn from((): ()) -> Content {
        Content::Empty
    }
}

impl fmt::Debug for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Empty => f.write_str("Empty"),
            Content::Text(text) => f.debug_tuple("Text").field(text).finish(),
            Content::Document(document) => fmt::Debug::fmt(document, f),
        }
    }
}

impl fmt::Debug for Document {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Document({})", Content::Document(self.clone()).to_json())
    }
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// Written as the value it encodes, into any format: the document's bytes
/// are read and written again token by token, with no tree between.
impl Serialize for Content {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Content::Empty => serializer.serialize_unit(),
            Content::Text(text) => serializer.serialize_str(text),
            Content::Document(document) => document.serialize(serializer),
        }
    }
}

impl Serialize for Document {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut reader = rmp_serde::Deserializer::from_read_ref(&self.0[..]).with_human_readable();
        serde_transcode::transcode(&mut reader, serializer)
            .map_err(|err| S::Error::custom(format!("unreadable document: {err}")))
    }
}

/// Read from any self-describing format: `null` is empty, a string is
/// text, and anything else is encoded as it is read, with no tree between.
impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Content, D::Error> {
        deserializer.deserialize_any(ContentVisitor)
    }
}

struct ContentVisitor;

impl ContentVisitor {
    fn encoded<T: Serialize, E: de::Error>(value: T) -> Result<Content, E> {
        Content::of(&value).map_err(E::custom)
    }

    fn captured<'de, D: Deserializer<'de>, E: de::Error>(inner: D) -> Result<Content, E> {
        let mut bytes = Vec::new();
        let mut writer = rmp_serde::Serializer::new(&mut bytes)
            .with_struct_map()
            .with_human_readable();
        serde_transcode::transcode(inner, &mut writer).map_err(E::custom)?;
        Ok(Content::Document(Document(bytes.into())))
    }
}

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message body")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
        Ok(Content::Empty)
    }

    fn visit_none<E: de::Error>(self) -> Result<Content, E> {
        Ok(Content::Empty)
    }

    fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Content, D::Error> {
        Content::deserialize(inner)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Content, E> {
        Ok(Content::Text(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Content, E> {
        Ok(Content::Text(text))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Content, E> {
        Self::encoded(value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Content, E> {
        Self::encoded(value)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Content, E> {
        Self::encoded(value)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Content, E> {
        Self::encoded(value)
    }

    fn visit_bytes<E: de::Error>(self, value: &[u8]) -> Result<Content, E> {
        Self::encoded(serde_bytes_of(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Content, A::Error> {
        Self::captured(de::value::SeqAccessDeserializer::new(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content, A::Error> {
        Self::captured(de::value::MapAccessDeserializer::new(map))
    }
}

/// Bytes written as MessagePack bytes (`bin`), not as a list of numbers.
fn serde_bytes_of(value: &[u8]) -> impl Serialize + '_ {
    struct Bytes<'a>(&'a [u8]);
    impl Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }
    Bytes(value)
}

#[cfg(test)]
mod tests;

//! Tests of the parent module (`spdy.rs`).

use super::*;
use bytes::Buf;

fn encoded(frames: &[Frame]) -> BytesMut {
    let mut out = BytesMut::new();
    for frame in frames {
        frame.encode(&mut out);
    }
    out
}

#[test]
fn frames_read_back_as_written() {
    let frames = [
        Frame::Data {
            stream: 3,
            fin: false,
            data: Bytes::from_static(b"hello"),
        },
        Frame::Data {
            stream: 3,
            fin: true,
            data: Bytes::new(),
        },
        Frame::SynStream {
            stream: 1,
            fin: false,
            block: Bytes::from_static(b"\x78\x9c..."),
        },
        Frame::SynReply {
            stream: 1,
            fin: false,
            block: Bytes::from_static(b"xyz"),
        },
        Frame::RstStream {
            stream: 5,
            status: CANCEL,
        },
        Frame::Settings { entries: 0 },
        Frame::Ping { id: 2 },
        Frame::GoAway {
            last_good: 7,
            status: 0,
        },
        Frame::Headers {
            stream: 9,
            fin: true,
            block: Bytes::from_static(b"abc"),
        },
        Frame::WindowUpdate {
            stream: 3,
            delta: 65536,
        },
    ];
    let mut buffer = encoded(&frames);
    for frame in frames {
        assert_eq!(decode(&mut buffer).ok().flatten(), Some(frame));
    }
    assert!(buffer.is_empty());
    assert!(matches!(decode(&mut buffer), Ok(None)));
}

#[test]
fn the_wire_format_is_spdy_3() {
    let out = encoded(&[Frame::Data {
        stream: 3,
        fin: true,
        data: Bytes::from_static(b"ab"),
    }]);
    assert_eq!(&out[..], &[0, 0, 0, 3, 1, 0, 0, 2, b'a', b'b']);
    let out = encoded(&[Frame::Ping { id: 1 }]);
    assert_eq!(&out[..], &[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
    let out = encoded(&[Frame::SynStream {
        stream: 1,
        fin: false,
        block: Bytes::from_static(b"B"),
    }]);
    assert_eq!(
        &out[..],
        &[
            0x80, 3, 0, 1, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, b'B'
        ]
    );
}

#[test]
fn a_cut_frame_waits_for_the_rest() {
    let whole = encoded(&[Frame::Data {
        stream: 1,
        fin: false,
        data: Bytes::from(vec![7u8; 100]),
    }]);
    for cut in [0, 3, 8, 50, whole.len() - 1] {
        let mut buffer = BytesMut::from(&whole[..cut]);
        assert!(matches!(decode(&mut buffer), Ok(None)), "cut at {cut}");
        assert_eq!(buffer.len(), cut, "nothing taken while cut");
    }
}

#[test]
fn an_oversized_frame_is_refused_from_its_header() {
    // A DATA frame saying 16 MiB - 1, only its header there.
    let mut buffer = BytesMut::from(&[0u8, 0, 0, 1, 0, 0xff, 0xff, 0xff][..]);
    assert!(matches!(
        decode(&mut buffer),
        Err(SpdyError::TooLong(0xff_ffff))
    ));
    let mut buffer = BytesMut::from(&[0x80u8, 3, 0, 2, 0, 0x10, 0, 1][..]);
    assert!(matches!(decode(&mut buffer), Err(SpdyError::TooLong(_))));
}

#[test]
fn garbled_frames_are_errors_not_panics() {
    let garbled: [&[u8]; 7] = [
        // Data on stream 0.
        &[0, 0, 0, 0, 0, 0, 0, 1, 9],
        // SPDY/2.
        &[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1],
        // A PING of 3 bytes.
        &[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 1],
        // A RST_STREAM of 4 bytes.
        &[0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1],
        // A SYN_STREAM shorter than its fixed part.
        &[0x80, 3, 0, 1, 0, 0, 0, 2, 0, 1],
        // SETTINGS saying 2 entries, carrying 1.
        &[
            0x80, 3, 0, 4, 0, 0, 0, 12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1,
        ],
        // A GOAWAY of 9 bytes.
        &[0x80, 3, 0, 7, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ];
    for bytes in garbled {
        let mut buffer = BytesMut::from(bytes);
        assert!(
            matches!(decode(&mut buffer), Err(SpdyError::Garbled(_))),
            "{bytes:?}"
        );
    }
    // A SYN_REPLY with no room for its stream id.
    let mut buffer = BytesMut::from(&[0x80u8, 3, 0, 2, 0, 0, 0, 2, 0, 1][..]);
    assert!(matches!(decode(&mut buffer), Err(SpdyError::Garbled(_))));
    // A control type SPDY/3 does not have is read (and ignored).
    let mut buffer = BytesMut::from(&[0x80u8, 3, 0, 42, 0, 0, 0, 1, 0][..]);
    assert_eq!(
        decode(&mut buffer).ok().flatten(),
        Some(Frame::Unknown { kind: 42 })
    );
}

/// Reads one name/value block back.
fn headers_of(plain: &[u8]) -> Vec<(String, String)> {
    let mut buf = plain;
    let count = buf.get_u32();
    (0..count)
        .map(|_| {
            let len = buf.get_u32() as usize;
            let name = String::from_utf8(buf[..len].to_vec()).expect("name");
            buf.advance(len);
            let len = buf.get_u32() as usize;
            let value = String::from_utf8(buf[..len].to_vec()).expect("value");
            buf.advance(len);
            (name, value)
        })
        .collect()
}

#[test]
fn header_blocks_are_one_zlib_stream_without_dictionary() {
    let mut compressor = HeaderCompressor::default();
    let first = compressor
        .block(&[("streamType", "error")])
        .expect("compressed");
    let second = compressor
        .block(&[("streamtype", "stdin")])
        .expect("compressed");
    // A zlib header with no preset dictionary (FDICT, bit 5, clear).
    assert_eq!(first[0] & 0x0f, 8);
    assert_eq!(first[1] & 0x20, 0);
    assert_eq!(((u16::from(first[0]) << 8) | u16::from(first[1])) % 31, 0);
    // Each block decodes on its own, the second in the first's context.
    let mut zlib = flate2::Decompress::new(true);
    let mut read = |block: &[u8]| {
        let mut out = Vec::with_capacity(1024);
        zlib.decompress_vec(block, &mut out, flate2::FlushDecompress::Sync)
            .expect("decompressed");
        headers_of(&out)
    };
    assert_eq!(
        read(&first),
        [("streamtype".to_owned(), "error".to_owned())]
    );
    assert_eq!(
        read(&second),
        [("streamtype".to_owned(), "stdin".to_owned())]
    );
}

#[test]
fn streams_are_created_as_kubectl_does() {
    let exec = StreamIds::for_wanted(Wanted {
        stdin: true,
        stdout: true,
        stderr: true,
        tty: false,
    });
    assert_eq!(
        exec.streams,
        [
            (channel::ERROR, 1, "error"),
            (channel::STDIN, 3, "stdin"),
            (channel::STDOUT, 5, "stdout"),
            (channel::STDERR, 7, "stderr"),
        ]
    );
    let terminal = StreamIds::for_wanted(Wanted {
        stdin: true,
        stdout: true,
        stderr: true,
        tty: true,
    });
    assert_eq!(
        terminal.streams,
        [
            (channel::ERROR, 1, "error"),
            (channel::STDIN, 3, "stdin"),
            (channel::STDOUT, 5, "stdout"),
            (channel::RESIZE, 7, "resize"),
        ]
    );
    assert_eq!(terminal.stream(channel::STDERR), None);
    assert_eq!(terminal.channel(5), Some(channel::STDOUT));
}

/// The next frame a fake server reads from `tcp`.
async fn server_reads(tcp: &mut TcpStream, buffer: &mut BytesMut) -> Frame {
    loop {
        if let Some(frame) = decode(buffer).expect("a frame") {
            return frame;
        }
        assert_ne!(tcp.read_buf(buffer).await.expect("read"), 0, "cut");
    }
}

/// A session against a fake server speaking as spdystream does: it
/// pings first, answers each stream, reads stdin to its FIN, then
/// writes stdout and the outcome (in two pieces) and goes away.
#[tokio::test]
async fn a_session_carries_stdin_to_its_end_and_the_outcome_whole() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listener");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accepted");
        let mut buffer = BytesMut::new();
        while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
            tcp.read_buf(&mut buffer).await.expect("head");
        }
        let head = String::from_utf8_lossy(&buffer).into_owned();
        assert!(head.starts_with("POST /exec/token HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("Upgrade: SPDY/3.1\r\n"), "{head}");
        buffer.clear();
        let mut out = BytesMut::from(
            &b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                   Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"[..],
        );
        Frame::Ping { id: 2 }.encode(&mut out);
        tcp.write_all(&out).await.expect("answer");
        let mut zlib = flate2::Decompress::new(true);
        let mut types = Vec::new();
        let mut stdin = Vec::new();
        let mut pinged = false;
        loop {
            match server_reads(&mut tcp, &mut buffer).await {
                Frame::SynStream { stream, block, .. } => {
                    let mut plain = Vec::with_capacity(1024);
                    zlib.decompress_vec(&block, &mut plain, flate2::FlushDecompress::Sync)
                        .expect("headers");
                    types.push((stream, headers_of(&plain)[0].1.clone()));
                    let mut reply = BytesMut::new();
                    Frame::SynReply {
                        stream,
                        fin: false,
                        block: Bytes::new(),
                    }
                    .encode(&mut reply);
                    tcp.write_all(&reply).await.expect("reply");
                }
                Frame::Ping { id } => pinged = id == 2,
                Frame::Data {
                    stream: 3,
                    fin,
                    data,
                } => {
                    stdin.extend_from_slice(&data);
                    if fin {
                        break;
                    }
                }
                other => panic!("the client sent {other:?}"),
            }
        }
        let status = br#"{"kind":"Status","status":"Success"}"#;
        let mut out = BytesMut::new();
        for frame in [
            Frame::Data {
                stream: 5,
                fin: false,
                data: Bytes::from_static(b"out"),
            },
            Frame::Data {
                stream: 1,
                fin: false,
                data: Bytes::copy_from_slice(&status[..10]),
            },
            Frame::Data {
                stream: 1,
                fin: true,
                data: Bytes::copy_from_slice(&status[10..]),
            },
            Frame::RstStream {
                stream: 5,
                status: CANCEL,
            },
            Frame::GoAway {
                last_good: 0,
                status: 0,
            },
        ] {
            frame.encode(&mut out);
        }
        tcp.write_all(&out).await.expect("output");
        (types, stdin, pinged)
    });
    let url = format!("http://{address}/exec/token");
    let wanted = Wanted {
        stdin: true,
        stdout: true,
        ..Wanted::default()
    };
    let (mut reader, writer) = connect(&url, wanted, Duration::from_secs(10))
        .await
        .expect("connected");
    let input = Bytes::from(vec![b'x'; 100_000]);
    writer.send(channel::STDIN, input).await.expect("stdin");
    writer.end(channel::STDIN).await.expect("stdin's end");
    writer
        .end(channel::STDIN)
        .await
        .expect("a second end sends nothing");
    let mut got = Vec::new();
    while let Some(chunk) = reader.next().await.expect("read") {
        got.push(chunk);
    }
    assert_eq!(
        got,
        [
            (channel::STDOUT, Bytes::from_static(b"out")),
            (
                channel::ERROR,
                Bytes::from_static(br#"{"kind":"Status","status":"Success"}"#)
            ),
        ]
    );
    let (types, stdin, pinged) = server.await.expect("server");
    assert_eq!(
        types,
        [
            (1, "error".to_owned()),
            (3, "stdin".to_owned()),
            (5, "stdout".to_owned())
        ]
    );
    assert_eq!(stdin.len(), 100_000);
    assert!(pinged, "the server's PING echoed");
}

#[test]
fn the_answer_must_be_101_with_v4() {
    let good = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                    Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io";
    assert!(check_answer(good).is_ok());
    assert!(check_answer("HTTP/1.1 404 Not Found\r\nContent-Length: 0").is_err());
    let other = "HTTP/1.1 101 Switching Protocols\r\nX-Stream-Protocol-Version: v3.channel.k8s.io";
    assert!(check_answer(other).is_err());
    assert!(check_answer("").is_err());
    let request = upgrade_request("127.0.0.1:1234", "exec/abc");
    assert!(request.starts_with("POST /exec/abc HTTP/1.1\r\nHost: 127.0.0.1:1234\r\n"));
    assert!(request.ends_with("\r\n\r\n"));
}

//! A client talking to a server that chose protocol version 5 (before `WriteZeros`): a run of
//! zeros travels as written zeros, never as a frame that server does not know. The server here
//! is a small stand-in speaking the wire protocol on a Unix socket (no version-5 server build
//! exists to run): it answers the handshake with version 5 and records every write.

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::UnixListener;
use std::thread;

use spillway_client::{Client, ClientOptions};
use spillway_proto::frame::{read_header_and_body, read_payload, write_frame};
use spillway_proto::{AuthMethod, Endpoint, ErrorCode, Kind, Request, Response, ServerId};
use spillway_types::{EpochId, FileId};

/// What the stand-in saw: each write's (offset, bytes), and the kinds it refused.
struct Seen {
    writes: Vec<(u64, Vec<u8>)>,
    refused: Vec<Kind>,
}

/// Serves one connection as a version-5 server until the client hangs up.
fn serve_version_5(listener: UnixListener) -> Seen {
    let (stream, _) = listener.accept().unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = BufWriter::new(stream);
    let mut seen = Seen { writes: Vec::new(), refused: Vec::new() };
    let mut body = Vec::new();
    let reply = |writer: &mut BufWriter<_>, id: u64, response: Response| {
        write_frame(writer, response.kind(), id, &response.encode_body(), &[]).unwrap();
        writer.flush().unwrap();
    };
    while let Ok(header) = read_header_and_body(&mut reader, &mut body, 64 << 20) {
        let mut payload = vec![0u8; header.payload_bytes as usize];
        read_payload(&mut reader, &mut payload).unwrap();
        let response = match Request::decode(header.kind, &body) {
            Ok(Request::Hello { version_max, .. }) => {
                assert!(version_max >= 5, "the client speaks version 5");
                Response::Hello {
                    version: 5,
                    payload_bytes_max: 8 << 20,
                    in_flight_requests_max: 64,
                    uid: 0,
                    gid: 0,
                    server_name: "version-5".into(),
                    auth: AuthMethod::None,
                    challenge: [0; 32],
                    server_id: ServerId([7; 16]),
                    incarnation: 1,
                    failure_domain: "here".into(),
                }
            }
            Ok(Request::OpenFile { .. }) => Response::FileOpened { file: FileId(1), created: true },
            Ok(Request::Write { offset, .. }) => {
                let bytes = payload.len() as u32;
                seen.writes.push((offset, payload));
                Response::Written { bytes }
            }
            Ok(Request::WriteExtents { extents, .. }) => {
                let mut at = 0;
                for extent in &extents {
                    let end = at + extent.length as usize;
                    seen.writes.push((extent.offset, payload[at..end].to_vec()));
                    at = end;
                }
                Response::Written { bytes: payload.len() as u32 }
            }
            // What a version-5 server says of a kind it does not know.
            _ => {
                seen.refused.push(header.kind);
                Response::Error { code: ErrorCode::BadFrame, message: "unknown kind".into() }
            }
        };
        reply(&mut writer, header.request_id, response);
    }
    seen
}

#[test]
fn a_run_of_zeros_reaches_a_version_5_server_as_written_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("v5.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let server = thread::spawn(move || serve_version_5(listener));
    let (offset, length) = (100u64, (3u64 << 20) + 5);
    {
        let mut client =
            Client::connect(&[Endpoint::Unix(socket)], ClientOptions::default()).unwrap();
        let mut file = client.create_file(EpochId(1), "f").unwrap();
        client.write(&mut file, 0, &[9; 100]).unwrap();
        client.write_zeros(&mut file, offset, length).unwrap();
        client.flush().unwrap();
    }
    let seen = server.join().unwrap();
    assert!(seen.refused.is_empty(), "frames a version-5 server does not know: {:?}", seen.refused);
    // Written before the run and gathered with its first zeros (adjacent) into one frame.
    let mut image: Vec<Option<u8>> = vec![None; (offset + length) as usize];
    for (at, bytes) in &seen.writes {
        for (i, &b) in bytes.iter().enumerate() {
            image[*at as usize + i] = Some(b);
        }
    }
    assert!(image[..100].iter().all(|&b| b == Some(9)), "the write before the run");
    let wrong = image[100..].iter().position(|&b| b != Some(0));
    assert_eq!(wrong, None, "a byte of the run not written as a zero (index from {offset})");
}

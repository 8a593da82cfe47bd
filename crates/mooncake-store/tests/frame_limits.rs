//! Frame readers against peers that declare large frames and send little,
//! stall mid-frame, or stay idle between frames: memory follows the bytes
//! that arrived, a started frame has a deadline, an idle connection has none
//! (unless configured). Waits are bounded; nothing asserts a duration.

use std::io::{self, Cursor, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use mooncake_store::master::{MasterConfig, MasterHandle};
use mooncake_store::proto::frame::{
    encode_frame, read_frame, read_frame_async, read_frame_within, MAX_FRAME_LEN,
};
use mooncake_store::proto::Request;
use test_support::ports::MASTER_ANY_PORTS;
use tokio::io::AsyncWriteExt;

/// A declared maximum-size frame of which only `sent` payload bytes arrive.
fn truncated_frame(sent: usize) -> Vec<u8> {
    let mut bytes = (MAX_FRAME_LEN as u32).to_le_bytes().to_vec();
    bytes.extend(std::iter::repeat_n(1u8, sent));
    bytes
}

fn frame_of(req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(req, &mut out).unwrap();
    out
}

#[test]
fn body_buffer_follows_the_bytes_that_arrived() {
    for sent in [1, 1000, 200_000] {
        let mut buf = Vec::new();
        let err = read_frame(&mut Cursor::new(truncated_frame(sent)), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(
            buf.capacity() <= 2 * sent + (128 << 10),
            "{sent} bytes of a {MAX_FRAME_LEN}-byte frame took {} bytes",
            buf.capacity()
        );
    }
    // Large frames still arrive whole, over several growth steps.
    let key = "k".repeat(3 << 20);
    let frame = frame_of(&Request::ExistKey { key: &key });
    let mut buf = Vec::new();
    read_frame(&mut Cursor::new(&frame), &mut buf).unwrap();
    assert_eq!(buf, frame[4..]);
    // And back to back on one stream.
    let small = frame_of(&Request::ExistKey { key: "x" });
    let mut two = Cursor::new([frame.clone(), small.clone()].concat());
    read_frame(&mut two, &mut buf).unwrap();
    assert_eq!(buf, frame[4..]);
    read_frame(&mut two, &mut buf).unwrap();
    assert_eq!(buf, small[4..]);
}

/// A blocking socket seen through its read timeout: `quiet` reads time out
/// (after `tick`), then `data` arrives, then every read times out. Panics
/// after `max_reads` reads, so a reader that never gives up cannot hang.
struct Socket {
    quiet: usize,
    data: Cursor<Vec<u8>>,
    tick: Duration,
    reads: usize,
    max_reads: usize,
}

impl Read for Socket {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        assert!(self.reads <= self.max_reads, "reader never gave up");
        if self.quiet > 0 {
            self.quiet -= 1;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match self.data.read(out)? {
            0 => {
                std::thread::sleep(self.tick);
                Err(io::ErrorKind::WouldBlock.into())
            }
            n => Ok(n),
        }
    }
}

#[test]
fn blocking_reader_waits_between_frames_but_not_within_one() {
    let frame = frame_of(&Request::ExistKey { key: "k" });
    // Idle: many read timeouts before the frame are no error.
    let mut idle = Socket {
        quiet: 1000,
        data: Cursor::new(frame.clone()),
        tick: Duration::ZERO,
        reads: 0,
        max_reads: 10_000,
    };
    let mut buf = Vec::new();
    read_frame_within(&mut idle, &mut buf, Duration::from_millis(50), true).unwrap();
    assert_eq!(buf, frame[4..]);
    // A frame that stalls after its first bytes fails, and has not taken
    // the declared size in memory.
    let mut stalled = Socket {
        quiet: 3,
        data: Cursor::new(truncated_frame(1)),
        tick: Duration::from_millis(10),
        reads: 0,
        max_reads: 10_000,
    };
    let err =
        read_frame_within(&mut stalled, &mut buf, Duration::from_millis(50), true).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(buf.capacity() < 1 << 20);
    // Awaiting an answer (not idle): silence itself is the failure.
    let mut silent = Socket {
        quiet: 0,
        data: Cursor::new(Vec::new()),
        tick: Duration::from_millis(10),
        reads: 0,
        max_reads: 10_000,
    };
    let err =
        read_frame_within(&mut silent, &mut buf, Duration::from_millis(50), false).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
}

#[tokio::test(start_paused = true)]
async fn async_reader_waits_between_frames_but_not_within_one() {
    let frame = frame_of(&Request::ExistKey { key: "k" });
    let limit = Duration::from_secs(30);
    let (mut peer, mut conn) = tokio::io::duplex(1 << 16);
    let mut buf = Vec::new();
    // An hour of silence between frames is fine without an idle limit.
    let writer = {
        let frame = frame.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            peer.write_all(&frame).await.unwrap();
            peer
        })
    };
    assert!(read_frame_async(&mut conn, &mut buf, None, limit)
        .await
        .unwrap());
    assert_eq!(buf, frame[4..]);
    let mut peer = writer.await.unwrap();
    // A started frame that stalls ends with TimedOut, holding little memory.
    peer.write_all(&truncated_frame(1)).await.unwrap();
    let err = read_frame_async(&mut conn, &mut buf, None, limit)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(buf.capacity() < 1 << 20);
    // With an idle limit, silence ends the connection too.
    let (_peer2, mut conn2) = tokio::io::duplex(1 << 16);
    let err = read_frame_async(&mut conn2, &mut buf, Some(Duration::from_secs(5)), limit)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    // A clean close between frames is not an error.
    drop(peer);
    let (peer3, mut conn3) = tokio::io::duplex(16);
    drop(peer3);
    assert!(!read_frame_async(&mut conn3, &mut buf, None, limit)
        .await
        .unwrap());
}

#[test]
fn master_closes_a_connection_whose_frame_stalls() {
    let config = MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("rpc_thread_num", "2"),
        ("rpc_conn_timeout_seconds", "1"),
    ]))
    .unwrap();
    let master = MasterHandle::spawn(config).unwrap();
    let mut s = TcpStream::connect(master.rpc_addr()).unwrap();
    // Declares 64 MiB, sends one byte of it, then nothing.
    s.write_all(&truncated_frame(1)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("a stalled frame kept its connection open: {other:?}"),
    }
}

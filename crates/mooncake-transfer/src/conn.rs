//! Blocking socket helpers shared by the RPC listener and the TCP transport:
//! whole-header reads, vectored writes without extra copies, draining.

use std::io::{self, IoSlice, Read, Write};

use crate::frame::HEADER_LEN;

/// Reads one header. `Ok(false)`: the peer closed the connection cleanly
/// before sending a byte of it. With a read timeout set, an idle connection
/// keeps waiting as long as `keep_waiting()` says so; a timeout in the middle
/// of a header is an error.
pub(crate) fn read_header(
    r: &mut impl Read,
    buf: &mut [u8; HEADER_LEN],
    keep_waiting: impl Fn() -> bool,
) -> io::Result<bool> {
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 && is_timeout(&e) && keep_waiting() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Writes every byte of `parts`, in order, with as few `writev` calls as the
/// kernel allows (payloads go straight from registered memory to the socket).
pub(crate) fn write_all_parts(w: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    const MAX_IOV: usize = 1024;
    let (mut idx, mut off) = (0, 0);
    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len().min(MAX_IOV));
    loop {
        while idx < parts.len() && off == parts[idx].len() {
            idx += 1;
            off = 0;
        }
        if idx == parts.len() {
            return Ok(());
        }
        iov.clear();
        iov.push(IoSlice::new(&parts[idx][off..]));
        iov.extend(
            parts[idx + 1..]
                .iter()
                .take(MAX_IOV - 1)
                .map(|p| IoSlice::new(p)),
        );
        let mut n = match w.write_vectored(&iov) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            let left = parts[idx].len() - off;
            if n < left {
                off += n;
                break;
            }
            n -= left;
            idx += 1;
            off = 0;
        }
    }
}

/// Reads and discards `n` bytes (a refused write's payload), keeping the
/// stream in step without touching any registered memory.
pub(crate) fn drain(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut scratch = [0u8; 16 * 1024];
    while n > 0 {
        let want = scratch.len().min(n as usize);
        r.read_exact(&mut scratch[..want])?;
        n -= want as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts at most `chunk` bytes per call, to exercise partial writes.
    struct Trickle {
        out: Vec<u8>,
        chunk: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.chunk);
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let mut budget = self.chunk;
            let mut done = 0;
            for b in bufs {
                let n = b.len().min(budget);
                self.out.extend_from_slice(&b[..n]);
                budget -= n;
                done += n;
                if budget == 0 {
                    break;
                }
            }
            Ok(done)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_vectored_writes_keep_order() {
        let a: Vec<u8> = (0..100).collect();
        let b: Vec<u8> = vec![];
        let c: Vec<u8> = (100..=255).collect();
        let parts: Vec<&[u8]> = vec![&a, &b, &c, &a[..1]];
        for chunk in [1, 3, 7, 64, 1000] {
            let mut t = Trickle { out: vec![], chunk };
            write_all_parts(&mut t, &parts).unwrap();
            assert_eq!(t.out, [&a[..], &c[..], &a[..1]].concat(), "chunk {chunk}");
        }
        let mut t = Trickle {
            out: vec![],
            chunk: 0,
        };
        assert_eq!(
            write_all_parts(&mut t, &parts).unwrap_err().kind(),
            io::ErrorKind::WriteZero
        );
        write_all_parts(&mut t, &[]).unwrap();
    }

    #[test]
    fn header_reads() {
        let bytes = [5u8; HEADER_LEN + 3];
        let mut buf = [0u8; HEADER_LEN];
        let mut r = &bytes[..];
        assert!(read_header(&mut r, &mut buf, || false).unwrap());
        assert_eq!(buf, [5u8; HEADER_LEN]);
        assert_eq!(
            read_header(&mut r, &mut buf, || false).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let mut empty = &[][..];
        assert!(!read_header(&mut empty, &mut buf, || false).unwrap());
    }

    #[test]
    fn drains_exactly() {
        let bytes = vec![1u8; 40_000];
        let mut r = &bytes[..];
        drain(&mut r, 39_999).unwrap();
        assert_eq!(r.len(), 1);
        assert!(drain(&mut r, 2).is_err());
    }
}

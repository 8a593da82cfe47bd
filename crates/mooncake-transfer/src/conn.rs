//! Blocking socket helpers shared by the RPC listener and the TCP transport:
//! whole-header reads, vectored writes without extra copies, draining.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};

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
    write_all_parts_paced(w, parts, || Ok(()))
}

/// [`write_all_parts`], asking `pace` before every write call whether to go
/// on (an error from it ends the write).
pub(crate) fn write_all_parts_paced(
    w: &mut impl Write,
    parts: &[&[u8]],
    mut pace: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
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
        pace()?;
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

/// Buffered frame input that still lands payloads straight in their
/// destination. Headers come from a small read-ahead buffer; reading a
/// payload asks the kernel for the bytes after it too (`readv` into the
/// payload, then into the buffer), so a pipelined stream costs about one
/// syscall per frame and a run of small frames (read requests, acks) one
/// syscall for many.
pub(crate) struct FrameReader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl FrameReader {
    const AHEAD: usize = 16 * 1024;

    pub(crate) fn new() -> FrameReader {
        FrameReader {
            buf: vec![0u8; Self::AHEAD].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// A whole header is already here: reading it will not block.
    pub(crate) fn has_header(&self) -> bool {
        self.buffered() >= HEADER_LEN
    }

    /// Next header; `Ok(None)` when the peer closed cleanly between frames.
    /// With a read timeout set, an idle connection keeps waiting as long as
    /// `keep_waiting()` says so; a timeout inside a header is an error.
    pub(crate) fn read_header(
        &mut self,
        r: &mut impl Read,
        keep_waiting: impl Fn() -> bool,
    ) -> io::Result<Option<[u8; HEADER_LEN]>> {
        self.read_header_paced(r, keep_waiting, &mut || Ok(()))
    }

    /// [`Self::read_header`], asking `pace` before every read that
    /// continues a header already begun whether to go on (an error from it
    /// ends the read), so a trickled header can be cut off.
    pub(crate) fn read_header_paced(
        &mut self,
        r: &mut impl Read,
        keep_waiting: impl Fn() -> bool,
        pace: &mut impl FnMut() -> io::Result<()>,
    ) -> io::Result<Option<[u8; HEADER_LEN]>> {
        while self.buffered() < HEADER_LEN {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end > 0 {
                pace()?;
            }
            match r.read(&mut self.buf[self.end..]) {
                Ok(0) if self.end == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.end == 0 && is_timeout(&e) && keep_waiting() => {}
                Err(e) => return Err(e),
            }
        }
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        self.start += HEADER_LEN;
        Ok(Some(h))
    }

    /// Whether the next `n` bytes are already here (reading them will not block).
    pub(crate) fn has(&self, n: u64) -> bool {
        self.buffered() as u64 >= n
    }

    /// Fills `dst` with the next bytes of the stream.
    pub(crate) fn read_into(&mut self, r: &mut impl Read, dst: &mut [u8]) -> io::Result<()> {
        self.read_into_paced(r, dst, &mut || Ok(()))
    }

    /// [`Self::read_into`], asking `pace` before every read from `r` whether
    /// to go on (an error from it ends the read).
    pub(crate) fn read_into_paced(
        &mut self,
        r: &mut impl Read,
        dst: &mut [u8],
        pace: &mut impl FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut filled = self.buffered().min(dst.len());
        dst[..filled].copy_from_slice(&self.buf[self.start..self.start + filled]);
        self.start += filled;
        if filled == dst.len() {
            return Ok(());
        }
        // The buffer is empty now: let the kernel continue into it.
        self.start = 0;
        self.end = 0;
        while filled < dst.len() {
            pace()?;
            let want = dst.len() - filled;
            let mut iov = [
                IoSliceMut::new(&mut dst[filled..]),
                IoSliceMut::new(&mut self.buf[self.end..]),
            ];
            match r.read_vectored(&mut iov) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    filled += n.min(want);
                    self.end += n.saturating_sub(want);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The next `len` bytes as a buffer that grows only as they arrive (at
    /// most twice what came, past a first 64 KiB), so a length that lies
    /// buys no memory. Paced like [`Self::read_into_paced`].
    pub(crate) fn read_vec_paced(
        &mut self,
        r: &mut impl Read,
        len: usize,
        pace: &mut impl FnMut() -> io::Result<()>,
    ) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while out.len() < len {
            let at = out.len();
            let step = (len - at).min(at.max(64 << 10));
            out.resize(at + step, 0);
            self.read_into_paced(r, &mut out[at..], pace)?;
        }
        Ok(out)
    }

    /// Discards the next `n` bytes (a refused write's payload).
    pub(crate) fn skip(&mut self, r: &mut impl Read, n: u64) -> io::Result<()> {
        self.skip_paced(r, n, &mut || Ok(()))
    }

    /// [`Self::skip`], paced like [`Self::read_into_paced`].
    pub(crate) fn skip_paced(
        &mut self,
        r: &mut impl Read,
        mut n: u64,
        pace: &mut impl FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut scratch = [0u8; 16 * 1024];
        while n > 0 {
            let want = scratch.len().min(n as usize);
            self.read_into_paced(r, &mut scratch[..want], pace)?;
            n -= want as u64;
        }
        Ok(())
    }
}

/// Hands out `data` at most `piece` bytes per read call (vectored reads
/// too), as a socket may: the tests and the fuzz targets drive the readers
/// across every boundary with it.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) struct Pieces<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) piece: usize,
}

#[cfg(any(test, feature = "fuzzing"))]
impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut budget = self.piece.min(self.data.len());
        let mut done = 0;
        for b in bufs {
            let n = b.len().min(budget);
            b[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            budget -= n;
            done += n;
        }
        Ok(done)
    }
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
    fn frame_reader_splits_headers_and_payloads_at_any_boundary() {
        // frames: header, 5000-byte payload, header, header, 3-byte payload, header
        let payload: Vec<u8> = (0..5000).map(|i| i as u8).collect();
        let h = |tag: u8| [tag; HEADER_LEN];
        let stream = [&h(1)[..], &payload, &h(2), &h(3), b"xyz", &h(4)].concat();
        for piece in [1, 7, 32, 33, 4999, 5032, 1 << 20] {
            let mut r = Pieces {
                data: &stream,
                piece,
            };
            let mut fr = FrameReader::new();
            let mut dst = vec![0u8; 5000];
            assert_eq!(fr.read_header(&mut r, || false).unwrap(), Some(h(1)));
            fr.read_into(&mut r, &mut dst).unwrap();
            assert_eq!(dst, payload, "piece {piece}");
            assert_eq!(fr.read_header(&mut r, || false).unwrap(), Some(h(2)));
            assert_eq!(fr.read_header(&mut r, || false).unwrap(), Some(h(3)));
            fr.skip(&mut r, 3).unwrap();
            assert_eq!(fr.read_header(&mut r, || false).unwrap(), Some(h(4)));
            assert_eq!(fr.read_header(&mut r, || false).unwrap(), None);
        }
        // EOF inside a header or a payload is an error.
        let mut fr = FrameReader::new();
        let mut r = Pieces {
            data: &stream[..10],
            piece: 4,
        };
        assert!(fr.read_header(&mut r, || false).is_err());
        let mut fr = FrameReader::new();
        let mut r = Pieces {
            data: &stream[..100],
            piece: 64,
        };
        fr.read_header(&mut r, || false).unwrap();
        assert!(fr.read_into(&mut r, &mut [0u8; 5000]).is_err());
    }

    #[test]
    fn pacing_can_cut_a_transfer_short() {
        // A pace that allows `n` more socket calls, then refuses.
        fn allow(n: usize) -> impl FnMut() -> io::Result<()> {
            let mut left = n;
            move || {
                if left == 0 {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                left -= 1;
                Ok(())
            }
        }
        let data = vec![7u8; 1000];
        let mut fr = FrameReader::new();
        let mut r = Pieces {
            data: &data,
            piece: 100,
        };
        let mut dst = vec![0u8; 1000];
        let e = fr.read_into_paced(&mut r, &mut dst, &mut allow(3));
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::TimedOut);
        // Enough calls: done, and bytes already buffered need none.
        let mut r = Pieces {
            data: &data,
            piece: 100,
        };
        let mut fr = FrameReader::new();
        fr.read_into_paced(&mut r, &mut dst, &mut allow(10))
            .unwrap();
        assert_eq!(dst, data);
        let mut r = Pieces {
            data: &data,
            piece: 1000,
        };
        let mut fr = FrameReader::new();
        fr.read_into(&mut r, &mut dst[..10]).unwrap();
        fr.skip_paced(&mut r, 990, &mut allow(0)).unwrap();

        // A growing read returns exactly the bytes asked for.
        let big: Vec<u8> = (0..300_000).map(|i| i as u8).collect();
        let mut r = Pieces {
            data: &big,
            piece: 7000,
        };
        let mut fr = FrameReader::new();
        let got = fr.read_vec_paced(&mut r, 300_000, &mut || Ok(())).unwrap();
        assert_eq!(got, big);

        // A header trickled a byte per read is cut off once begun, not before.
        let mut r = Pieces {
            data: &[9u8; HEADER_LEN],
            piece: 1,
        };
        let mut fr = FrameReader::new();
        let e = fr.read_header_paced(&mut r, || false, &mut allow(HEADER_LEN - 2));
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::TimedOut);
        let mut r = Pieces {
            data: &[9u8; HEADER_LEN],
            piece: 1,
        };
        let mut fr = FrameReader::new();
        let h = fr.read_header_paced(&mut r, || false, &mut allow(HEADER_LEN - 1));
        assert_eq!(h.unwrap(), Some([9u8; HEADER_LEN]));

        let mut t = Trickle {
            out: vec![],
            chunk: 10,
        };
        let e = write_all_parts_paced(&mut t, &[&data], allow(5));
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(t.out.len(), 50);
    }
}

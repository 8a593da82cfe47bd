//! Checksum-verified reads of values into caller buffers.
//!
//! With `O_DIRECT`, a value that starts on a block boundary and a destination
//! that does too are read straight into the destination, all but the last
//! partial block; the rest goes through a small aligned bounce buffer. Any
//! other combination reads the covering blocks into a bounce buffer and
//! copies. Every byte handed back has passed the value's crc32c.

use super::format::{align_up, DIO_ALIGN};
use super::io::{AlignedBuf, DiskFile, IoEngine, ReadOp, MAX_IOV};
use super::{Result, TierError};

/// Where a value lives: its file, offset, length and checksum.
#[derive(Clone, Copy)]
pub struct ValueRef<'a> {
    pub file: &'a DiskFile,
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
}

/// One value of a batch read and where it goes.
pub struct ValueRead<'a> {
    pub value: ValueRef<'a>,
    pub dst: &'a mut [u8],
}

/// A read as one engine operation: the value's blocks, scattered over the
/// destination (the part that can be read there directly) and a bounce
/// buffer (the rest), so a value costs one request.
struct Plan {
    op: Option<ReadOp>,
    /// Bytes the op must return: a bounce may reach past the end of the
    /// file (the last block of a file-per-key object), the value may not.
    need: usize,
    /// (bounce buffer, bytes to skip at its start, bytes to copy, offset in dst)
    bounce: Option<(AlignedBuf, usize, usize, usize)>,
}

fn align_down(n: u64) -> u64 {
    n / DIO_ALIGN as u64 * DIO_ALIGN as u64
}

fn iovec(ptr: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr.cast(),
        iov_len: len,
    }
}

fn plan(v: &ValueRef<'_>, dst: &mut [u8]) -> Plan {
    let len = dst.len();
    let fd = v.file.fd();
    if len == 0 {
        return Plan {
            op: None,
            need: 0,
            bounce: None,
        };
    }
    if !v.file.is_direct() {
        return Plan {
            op: Some(ReadOp::new(fd, dst.as_mut_ptr(), len, v.offset)),
            need: len,
            bounce: None,
        };
    }
    let block = DIO_ALIGN as u64;
    let direct_body =
        if v.offset.is_multiple_of(block) && (dst.as_ptr() as usize).is_multiple_of(DIO_ALIGN) {
            len / DIO_ALIGN * DIO_ALIGN
        } else {
            0
        };
    let end = v.offset + len as u64;
    let mut iov = Vec::with_capacity(2);
    if direct_body > 0 {
        iov.push(iovec(dst.as_mut_ptr(), direct_body));
    }
    let mut bounce = None;
    let mut op_start = v.offset;
    if direct_body < len {
        // The body ends on a block boundary, so the bounce starts right
        // after it and the two pieces are one contiguous read.
        let start = v.offset + direct_body as u64;
        let a_start = align_down(start);
        if direct_body == 0 {
            op_start = a_start;
        }
        let a_len = (align_up(end, block) - a_start) as usize;
        let mut buf = AlignedBuf::new(a_len);
        iov.push(iovec(buf.as_mut_ptr(), a_len));
        bounce = Some((
            buf,
            (start - a_start) as usize,
            len - direct_body,
            direct_body,
        ));
    }
    Plan {
        op: Some(ReadOp {
            iov,
            ..ReadOp::new(fd, std::ptr::null_mut(), 0, op_start)
        }),
        need: (end - op_start) as usize,
        bounce,
    }
}

/// Checks the op's result, copies the bounce into `dst` and verifies the crc.
fn finish(v: &ValueRef<'_>, p: Plan, dst: &mut [u8]) -> Result<()> {
    let path = v.file.path();
    if let Some(op) = &p.op {
        match &op.result {
            Ok(n) if *n < p.need => {
                return Err(TierError::Corrupt {
                    what: format!("{}: value at {} truncated", path.display(), v.offset),
                });
            }
            Ok(_) => {}
            Err(e) => {
                return Err(TierError::io(
                    "read",
                    path,
                    std::io::Error::new(e.kind(), e.to_string()),
                ))
            }
        }
    }
    if let Some((bounce, skip, n, at)) = &p.bounce {
        dst[*at..*at + *n].copy_from_slice(&bounce[*skip..*skip + *n]);
    }
    if crc32c::crc32c(dst) != v.crc {
        return Err(TierError::Corrupt {
            what: format!("{}: checksum of the value at {}", path.display(), v.offset),
        });
    }
    Ok(())
}

fn check_len(v: &ValueRef<'_>, dst: &[u8]) -> Result<()> {
    if dst.len() as u64 != v.len {
        return Err(TierError::BufferSize {
            want: v.len,
            got: dst.len() as u64,
        });
    }
    Ok(())
}

fn einval(p: &Plan) -> bool {
    p.op.as_ref()
        .is_some_and(|op| matches!(&op.result, Err(e) if e.raw_os_error() == Some(libc::EINVAL)))
}

/// Runs a plan's op alone.
fn run(engine: &dyn IoEngine, p: &mut Plan) {
    if let Some(op) = p.op.as_mut() {
        // SAFETY: the op's pieces are the caller's `dst` (borrowed mutably
        // for the plan's use) and the plan's own bounce; disjoint, and alive
        // until `read_many` returns.
        unsafe { engine.read_many(std::slice::from_mut(op)) };
    }
}

/// Reads one whole value into `dst` (exactly its length) and verifies it.
pub fn read_value(engine: &dyn IoEngine, v: ValueRef<'_>, dst: &mut [u8]) -> Result<()> {
    check_len(&v, dst)?;
    let mut p = plan(&v, dst);
    run(engine, &mut p);
    if einval(&p) && v.file.is_direct() {
        v.file
            .fall_back_to_buffered()
            .map_err(|e| TierError::io("read", v.file.path(), e))?;
        p = plan(&v, dst);
        run(engine, &mut p);
    }
    finish(&v, p, dst)
}

/// Reads `dst.len()` bytes of the value starting at `start`. The checksum
/// covers the whole value, so the whole value is read and verified first.
pub fn read_range(
    engine: &dyn IoEngine,
    v: ValueRef<'_>,
    start: u64,
    dst: &mut [u8],
) -> Result<()> {
    let end = start
        .checked_add(dst.len() as u64)
        .filter(|&e| e <= v.len)
        .ok_or_else(|| {
            TierError::Invalid(format!(
                "range {start}+{} outside a value of {}",
                dst.len(),
                v.len
            ))
        })?;
    let mut whole = AlignedBuf::new(v.len as usize);
    read_value(engine, v, &mut whole[..v.len as usize])?;
    dst.copy_from_slice(&whole[start as usize..end as usize]);
    Ok(())
}

/// Largest read that adjacent values of a batch are merged into.
const MAX_MERGED: usize = 64 << 20;

/// Reads many values at once (the engine may keep them all in flight).
/// Values that lie back to back in one file (a bucket's objects, written
/// in order) are read as one request. Each value gets its own result; one
/// bad value does not fail the others.
pub fn read_values(engine: &dyn IoEngine, reads: &mut [ValueRead<'_>]) -> Vec<Result<()>> {
    let mut plans = Vec::with_capacity(reads.len());
    let mut checks = Vec::with_capacity(reads.len());
    for r in reads.iter_mut() {
        let c = check_len(&r.value, r.dst);
        plans.push(if c.is_ok() {
            Some(plan(&r.value, r.dst))
        } else {
            None
        });
        checks.push(c);
    }
    let mut order: Vec<usize> = (0..plans.len())
        .filter(|&i| plans[i].as_ref().is_some_and(|p| p.op.is_some()))
        .collect();
    let op_of = |plans: &[Option<Plan>], i: usize| -> (i32, u64, usize, usize) {
        let op = plans[i]
            .as_ref()
            .and_then(|p| p.op.as_ref())
            .expect("has an op");
        (op.fd, op.offset, op.len(), op.iov.len())
    };
    order.sort_by_key(|&i| {
        let (fd, offset, _, _) = op_of(&plans, i);
        (fd, offset)
    });
    // Runs of back-to-back ops become one op each: (member plans, the op).
    let mut merged: Vec<(Vec<usize>, ReadOp)> = Vec::new();
    for i in order {
        let (fd, offset, len, n_iov) = op_of(&plans, i);
        if let Some((members, op)) = merged.last_mut() {
            let op_len = op.len();
            if op.fd == fd
                && op.offset + op_len as u64 == offset
                && op.iov.len() + n_iov <= MAX_IOV
                && op_len + len <= MAX_MERGED
            {
                let iov = &plans[i]
                    .as_ref()
                    .and_then(|p| p.op.as_ref())
                    .expect("op")
                    .iov;
                op.iov.extend_from_slice(iov);
                members.push(i);
                continue;
            }
        }
        let iov = plans[i]
            .as_ref()
            .and_then(|p| p.op.as_ref())
            .expect("op")
            .iov
            .clone();
        merged.push((
            vec![i],
            ReadOp {
                iov,
                ..ReadOp::new(fd, std::ptr::null_mut(), 0, offset)
            },
        ));
    }
    let mut ops: Vec<ReadOp> = merged
        .iter_mut()
        .map(|(_, op)| std::mem::replace(op, ReadOp::new(0, std::ptr::null_mut(), 0, 0)))
        .collect();
    // SAFETY: every piece is a distinct `dst` (mutably borrowed through
    // `reads`) or a bounce owned by `plans`; both outlive the call.
    unsafe { engine.read_many(&mut ops) };
    for ((members, _), op) in merged.iter().zip(&ops) {
        let mut rel = 0usize;
        for &i in members {
            let own = plans[i].as_mut().and_then(|p| p.op.as_mut()).expect("op");
            let len = own.len();
            own.result = match &op.result {
                Ok(n) => Ok(n.saturating_sub(rel).min(len)),
                Err(e) => Err(match e.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(e.kind(), e.to_string()),
                }),
            };
            rel += len;
        }
    }
    let mut out = Vec::with_capacity(reads.len());
    for ((r, p), c) in reads.iter_mut().zip(plans).zip(checks) {
        let Some(p) = p else {
            out.push(c);
            continue;
        };
        out.push(if einval(&p) {
            read_value(engine, r.value, r.dst)
        } else {
            finish(&r.value, p, r.dst)
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::psync::PsyncEngine;
    use crate::io::uring::UringEngine;

    /// Values of these lengths laid out as a bucket lays them out (each on
    /// a block boundary), the file's bytes and each value's offset.
    fn layout(dir: &std::path::Path, lens: &[usize]) -> (std::path::PathBuf, Vec<u8>, Vec<u64>) {
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for (i, &n) in lens.iter().enumerate() {
            offsets.push(bytes.len() as u64);
            bytes.extend((0..n).map(|j| (j * 7 + i * 13) as u8));
            bytes.resize(align_up(bytes.len() as u64, DIO_ALIGN as u64) as usize, 0);
        }
        let p = dir.join("bucket");
        std::fs::write(&p, &bytes).unwrap();
        (p, bytes, offsets)
    }

    fn engines() -> Vec<Box<dyn IoEngine>> {
        let mut e: Vec<Box<dyn IoEngine>> = vec![Box::new(PsyncEngine)];
        if let Ok(u) = UringEngine::new() {
            e.push(Box::new(u));
        }
        e
    }

    /// Adjacent values are read as one request, into aligned and unaligned
    /// destinations alike; a value whose checksum fails fails alone, and a
    /// value cut short by the end of the file is reported truncated.
    #[test]
    fn a_batch_of_adjacent_values_reads_each_right_and_fails_each_alone() {
        let dir = tempfile::tempdir().unwrap();
        let lens = [70_000usize, 4096, 1, 200_000, 65_536, 5000];
        let (path, bytes, offsets) = layout(dir.path(), &lens);
        let file = DiskFile::open_read(&path).unwrap();
        for engine in engines() {
            let mut aligned: Vec<AlignedBuf> = lens.iter().map(|&n| AlignedBuf::new(n)).collect();
            let mut plain: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n + 1]).collect();
            let mut reads: Vec<ValueRead<'_>> = Vec::new();
            for (i, (a, p)) in aligned.iter_mut().zip(plain.iter_mut()).enumerate() {
                let at = offsets[i] as usize;
                let crc = crc32c::crc32c(&bytes[at..at + lens[i]]);
                // Every other value into an unaligned destination.
                let dst: &mut [u8] = if i % 2 == 0 {
                    &mut a[..lens[i]]
                } else {
                    &mut p[1..]
                };
                let wrong = i == 3;
                reads.push(ValueRead {
                    value: ValueRef {
                        file: &file,
                        offset: offsets[i],
                        len: lens[i] as u64,
                        crc: if wrong { crc ^ 1 } else { crc },
                    },
                    dst,
                });
            }
            // A value said to reach past the end of the file.
            let mut past = AlignedBuf::new(8192);
            reads.push(ValueRead {
                value: ValueRef {
                    file: &file,
                    offset: bytes.len() as u64 - 4096,
                    len: 8192,
                    crc: 0,
                },
                dst: &mut past[..8192],
            });
            let results = read_values(&*engine, &mut reads);
            for (i, r) in results.iter().enumerate() {
                match i {
                    3 => assert!(matches!(r, Err(TierError::Corrupt { .. })), "{r:?}"),
                    6 => assert!(
                        matches!(r, Err(TierError::Corrupt { what }) if what.contains("truncated")),
                        "{r:?}"
                    ),
                    _ => assert!(r.is_ok(), "value {i}: {r:?}"),
                }
            }
            drop(reads);
            for i in [0, 2, 4] {
                let at = offsets[i] as usize;
                assert!(
                    aligned[i][..lens[i]] == bytes[at..at + lens[i]],
                    "value {i}"
                );
            }
            for i in [1, 5] {
                let at = offsets[i] as usize;
                assert!(plain[i][1..] == bytes[at..at + lens[i]], "value {i}");
            }
        }
    }

    /// A scattered read that meets the end of the file stops there, however
    /// the pieces fall around it.
    #[test]
    fn a_scattered_read_stops_at_the_end_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, _) = layout(dir.path(), &[3 * 4096]);
        let file = DiskFile::open_read(&path).unwrap();
        for engine in engines() {
            let mut a = AlignedBuf::new(8192);
            let mut b = AlignedBuf::new(8192);
            let mut op = ReadOp::new(file.fd(), a.as_mut_ptr(), 8192, 0);
            op.iov.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: 8192,
            });
            // SAFETY: `a` and `b` are live, distinct and 8192 bytes long.
            unsafe { engine.read_many(std::slice::from_mut(&mut op)) };
            assert_eq!(*op.result.as_ref().unwrap(), 3 * 4096);
            assert!(a[..] == bytes[..8192]);
            assert!(b[..4096] == bytes[8192..]);
        }
    }
}

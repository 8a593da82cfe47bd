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

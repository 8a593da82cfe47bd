//! Checksum-verified reads of values into caller buffers.
//!
//! With `O_DIRECT`, a value that starts on a block boundary and a destination
//! that does too are read straight into the destination, all but the last
//! partial block; the rest goes through a small aligned bounce buffer. Any
//! other combination reads the covering blocks into a bounce buffer and
//! copies. Every byte handed back has passed the value's crc32c.

use super::format::{align_up, DIO_ALIGN};
use super::io::{AlignedBuf, DiskFile, IoEngine, ReadOp};
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

/// A read split into engine operations.
struct Plan {
    /// (bounce buffer, bytes to skip at its start, bytes to copy, offset in dst)
    bounces: Vec<(AlignedBuf, usize, usize, usize)>,
    ops: Vec<ReadOp>,
    /// Bytes each op must return: a bounce may reach past the end of the file
    /// (the last block of a file-per-key object), the value's bytes may not.
    need: Vec<usize>,
}

fn align_down(n: u64) -> u64 {
    n / DIO_ALIGN as u64 * DIO_ALIGN as u64
}

fn plan(v: &ValueRef<'_>, dst: &mut [u8]) -> Plan {
    let len = dst.len();
    let fd = v.file.fd();
    let mut p = Plan {
        bounces: Vec::new(),
        ops: Vec::new(),
        need: Vec::new(),
    };
    if len == 0 {
        return p;
    }
    if !v.file.is_direct() {
        p.ops.push(ReadOp {
            fd,
            buf: dst.as_mut_ptr(),
            len,
            offset: v.offset,
            result: Ok(0),
        });
        p.need.push(len);
        return p;
    }
    let block = DIO_ALIGN as u64;
    let direct_body =
        if v.offset.is_multiple_of(block) && (dst.as_ptr() as usize).is_multiple_of(DIO_ALIGN) {
            len / DIO_ALIGN * DIO_ALIGN
        } else {
            0
        };
    if direct_body > 0 {
        p.ops.push(ReadOp {
            fd,
            buf: dst.as_mut_ptr(),
            len: direct_body,
            offset: v.offset,
            result: Ok(0),
        });
        p.need.push(direct_body);
    }
    if direct_body < len {
        let start = v.offset + direct_body as u64;
        let a_start = align_down(start);
        let a_len = (align_up(v.offset + len as u64, block) - a_start) as usize;
        let mut bounce = AlignedBuf::new(a_len);
        p.ops.push(ReadOp {
            fd,
            buf: bounce.as_mut_ptr(),
            len: a_len,
            offset: a_start,
            result: Ok(0),
        });
        p.need.push((v.offset + len as u64 - a_start) as usize);
        p.bounces.push((
            bounce,
            (start - a_start) as usize,
            len - direct_body,
            direct_body,
        ));
    }
    p
}

/// Checks the ops' results, copies bounces into `dst` and verifies the crc.
fn finish(v: &ValueRef<'_>, p: Plan, dst: &mut [u8]) -> Result<()> {
    let path = v.file.path();
    for (op, &needed) in p.ops.iter().zip(&p.need) {
        match &op.result {
            Ok(n) => {
                if *n < needed {
                    return Err(TierError::Corrupt {
                        what: format!("{}: value at {} truncated", path.display(), v.offset),
                    });
                }
            }
            Err(e) => {
                return Err(TierError::io(
                    "read",
                    path,
                    std::io::Error::new(e.kind(), e.to_string()),
                ))
            }
        }
    }
    for (bounce, skip, n, at) in &p.bounces {
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
    p.ops
        .iter()
        .any(|op| matches!(&op.result, Err(e) if e.raw_os_error() == Some(libc::EINVAL)))
}

/// Reads one whole value into `dst` (exactly its length) and verifies it.
pub fn read_value(engine: &dyn IoEngine, v: ValueRef<'_>, dst: &mut [u8]) -> Result<()> {
    check_len(&v, dst)?;
    let mut p = plan(&v, dst);
    // SAFETY: the plan's buffers are `dst` (borrowed mutably here) and bounces
    // it owns; they are disjoint and outlive the call.
    unsafe { engine.read_many(&mut p.ops) };
    if einval(&p) && v.file.is_direct() {
        v.file
            .fall_back_to_buffered()
            .map_err(|e| TierError::io("read", v.file.path(), e))?;
        p = plan(&v, dst);
        // SAFETY: as above.
        unsafe { engine.read_many(&mut p.ops) };
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

/// Reads many values at once (the engine may keep them all in flight). Each
/// gets its own result; one bad value does not fail the others.
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
    let mut ops: Vec<ReadOp> = Vec::new();
    let mut counts = Vec::with_capacity(plans.len());
    for p in plans.iter_mut() {
        counts.push(p.as_ref().map_or(0, |p| p.ops.len()));
        if let Some(p) = p {
            ops.append(&mut p.ops);
        }
    }
    // SAFETY: every op targets a distinct `dst` (mutably borrowed through
    // `reads`) or a bounce owned by `plans`; both outlive the call.
    unsafe { engine.read_many(&mut ops) };
    let mut ops = ops.into_iter();
    let mut out = Vec::with_capacity(reads.len());
    for (((r, p), c), n) in reads.iter_mut().zip(plans).zip(checks).zip(counts) {
        let Some(mut p) = p else {
            out.push(c);
            continue;
        };
        p.ops = ops.by_ref().take(n).collect();
        out.push(if einval(&p) {
            read_value(engine, r.value, r.dst)
        } else {
            finish(&r.value, p, r.dst)
        });
    }
    out
}

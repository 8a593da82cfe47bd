//! The calls the collectives and point-to-point operations make on a
//! rank's group, whichever transport carries it: [`ShmGroup`] (ranks on
//! one host) and [`TcpGroup`] (ranks on several) both implement
//! [`Transport`], so the bindings wrap either with one type.

use std::path::Path;
use std::time::Instant;

use crate::group::{Flag, GroupError, ShmGroup};
use crate::layout::SLOTS;
use crate::tcp::TcpGroup;

pub trait Transport: Send + Sync {
    /// `"shm"` or `"tcp"`.
    fn name(&self) -> &'static str;
    fn rank(&self) -> usize;
    /// Whether `rank` is this rank or a peer it mapped (dialed).
    fn connected(&self, rank: usize) -> bool;
    fn slot_bytes(&self) -> usize;
    /// The address of `rank`'s slot `slot`, if it is connected.
    fn slot_addr(&self, rank: usize, slot: usize) -> Option<usize>;
    fn post(&self, flag: Flag, value: u32);
    fn flag(&self, rank: usize, flag: Flag) -> u32;
    /// The ranks among `ranks` that died or left.
    fn dead(&self, ranks: &[usize]) -> Vec<usize>;
    /// Waits until every rank of `ranks` reached `value` of `flag` or is
    /// gone; returns the gone ones that did not reach it.
    fn wait(
        &self,
        ranks: &[usize],
        flag: Flag,
        value: u32,
        deadline: Instant,
    ) -> Result<Vec<usize>, GroupError>;
    /// Maps (dials) `peer`'s incarnation `nonce`, published at `place`
    /// (a segment's path, or `"host port"`) by process `pid`.
    fn attach(
        &self,
        peer: usize,
        place: &str,
        pid: i32,
        nonce: u64,
        deadline: Instant,
    ) -> Result<(), GroupError>;
    fn send(&self, dst: usize, tag: i64, data: &[u8], deadline: Instant)
        -> Result<u32, GroupError>;
    /// `send` when it can complete at once; None (nothing sent) otherwise.
    fn try_send(&self, dst: usize, tag: i64, data: &[u8]) -> Result<Option<u32>, GroupError>;
    fn wait_read(&self, dst: usize, end: u32, deadline: Instant) -> Result<(), GroupError>;
    fn recv_header(&self, src: usize, deadline: Instant) -> Result<(i64, usize), GroupError>;
    fn recv_body(&self, src: usize, out: &mut [u8], deadline: Instant) -> Result<(), GroupError>;
    fn pending(&self, src: usize) -> bool;
}

impl Transport for ShmGroup {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn rank(&self) -> usize {
        ShmGroup::rank(self)
    }
    fn connected(&self, rank: usize) -> bool {
        ShmGroup::connected(self, rank)
    }
    fn slot_bytes(&self) -> usize {
        self.layout().slot_bytes
    }
    fn slot_addr(&self, rank: usize, slot: usize) -> Option<usize> {
        (self.connected(rank) && slot < SLOTS).then(|| ShmGroup::slot_addr(self, rank, slot))
    }
    fn post(&self, flag: Flag, value: u32) {
        ShmGroup::post(self, flag, value)
    }
    fn flag(&self, rank: usize, flag: Flag) -> u32 {
        ShmGroup::flag(self, rank, flag)
    }
    fn dead(&self, ranks: &[usize]) -> Vec<usize> {
        ShmGroup::dead(self, ranks)
    }
    fn wait(
        &self,
        ranks: &[usize],
        flag: Flag,
        value: u32,
        deadline: Instant,
    ) -> Result<Vec<usize>, GroupError> {
        ShmGroup::wait(self, ranks, flag, value, deadline)
    }
    /// The segment's path names its incarnation; `nonce` is the store's.
    fn attach(
        &self,
        peer: usize,
        place: &str,
        pid: i32,
        _nonce: u64,
        _deadline: Instant,
    ) -> Result<(), GroupError> {
        self.connect(peer, Path::new(place), pid)
    }
    fn send(
        &self,
        dst: usize,
        tag: i64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<u32, GroupError> {
        ShmGroup::send(self, dst, tag, data, deadline)
    }
    fn try_send(&self, dst: usize, tag: i64, data: &[u8]) -> Result<Option<u32>, GroupError> {
        Ok(ShmGroup::try_send(self, dst, tag, data))
    }
    fn wait_read(&self, dst: usize, end: u32, deadline: Instant) -> Result<(), GroupError> {
        ShmGroup::wait_read(self, dst, end, deadline)
    }
    fn recv_header(&self, src: usize, deadline: Instant) -> Result<(i64, usize), GroupError> {
        ShmGroup::recv_header(self, src, deadline)
    }
    fn recv_body(&self, src: usize, out: &mut [u8], deadline: Instant) -> Result<(), GroupError> {
        ShmGroup::recv_body(self, src, out, deadline)
    }
    fn pending(&self, src: usize) -> bool {
        ShmGroup::pending(self, src)
    }
}

impl Transport for TcpGroup {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn rank(&self) -> usize {
        TcpGroup::rank(self)
    }
    fn connected(&self, rank: usize) -> bool {
        TcpGroup::connected(self, rank)
    }
    fn slot_bytes(&self) -> usize {
        TcpGroup::slot_bytes(self)
    }
    fn slot_addr(&self, rank: usize, slot: usize) -> Option<usize> {
        TcpGroup::slot_addr(self, rank, slot)
    }
    fn post(&self, flag: Flag, value: u32) {
        TcpGroup::post(self, flag, value)
    }
    fn flag(&self, rank: usize, flag: Flag) -> u32 {
        TcpGroup::flag(self, rank, flag)
    }
    fn dead(&self, ranks: &[usize]) -> Vec<usize> {
        TcpGroup::dead(self, ranks)
    }
    fn wait(
        &self,
        ranks: &[usize],
        flag: Flag,
        value: u32,
        deadline: Instant,
    ) -> Result<Vec<usize>, GroupError> {
        TcpGroup::wait(self, ranks, flag, value, deadline)
    }
    /// `place` is `"host port"`; the process is watched through its
    /// connections, not its pid.
    fn attach(
        &self,
        peer: usize,
        place: &str,
        _pid: i32,
        nonce: u64,
        deadline: Instant,
    ) -> Result<(), GroupError> {
        let bad = || {
            GroupError::Setup(format!(
                "rank {peer}'s address {place:?} is not \"host port\""
            ))
        };
        let (host, port) = place.rsplit_once(' ').ok_or_else(bad)?;
        let port = port.parse().map_err(|_| bad())?;
        self.connect(peer, host, port, Some(nonce), deadline)
    }
    fn send(
        &self,
        dst: usize,
        tag: i64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<u32, GroupError> {
        TcpGroup::send(self, dst, tag, data, deadline)
    }
    fn try_send(&self, dst: usize, tag: i64, data: &[u8]) -> Result<Option<u32>, GroupError> {
        TcpGroup::try_send(self, dst, tag, data)
    }
    fn wait_read(&self, dst: usize, end: u32, deadline: Instant) -> Result<(), GroupError> {
        TcpGroup::wait_read(self, dst, end, deadline)
    }
    fn recv_header(&self, src: usize, deadline: Instant) -> Result<(i64, usize), GroupError> {
        TcpGroup::recv_header(self, src, deadline)
    }
    fn recv_body(&self, src: usize, out: &mut [u8], deadline: Instant) -> Result<(), GroupError> {
        TcpGroup::recv_body(self, src, out, deadline)
    }
    fn pending(&self, src: usize) -> bool {
        TcpGroup::pending(self, src)
    }
}

//! The two roles: a target that registers and serves DRAM, an initiator
//! that runs the sweep and prints a row per case.

use std::io::Write;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, TransferRequest};

use super::stats::{format_row, header, CaseStats};
use super::{Flags, OpType};
use crate::bench::Engine;

const WARMUP: Duration = Duration::from_secs(1);

fn io(e: std::io::Error) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, e.to_string())
}

fn bad(m: String) -> Error {
    Error::new(ErrorCode::ERR_INVALID_ARGUMENT, m)
}

fn start_engine(f: &Flags) -> Result<Engine> {
    let name = match f.seg_name.trim() {
        "" => "127.0.0.1",
        n => n,
    };
    let port = (f.rpc_server_port != 0).then_some(f.rpc_server_port);
    Engine::start_with(f.backend, &f.metadata_server(), name, &[], port)
}

/// Runs the role `f` names; the target serves until the process is killed.
pub fn run(f: &Flags, out: &mut dyn Write) -> Result<()> {
    let engine = start_engine(f)?;
    let len = usize::try_from(f.total_buffer_size)
        .map_err(|_| bad("--total_buffer_size does not fit in memory".into()))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| bad(format!("cannot allocate --total_buffer_size={len}")))?;
    buf.resize(len, 0u8);
    engine.register(buf.as_ptr() as usize, len, f.is_target())?;
    if f.is_target() {
        write!(
            out,
            "\x1b[33mTo start initiators, run \n  ./tebench --target_seg_name={} --seg_type=DRAM --backend={}\nPress Ctrl-C to terminate\x1b[0m\n",
            engine.name(),
            f.backend_name()
        )
        .map_err(io)?;
        out.flush().map_err(io)?;
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let targets = f
        .target_seg_names
        .iter()
        .map(|name| Target::open(&engine, name, f))
        .collect::<Result<Vec<_>>>()?;
    writeln!(out, "{}", header()).map_err(io)?;
    let mut threads = f.start_num_threads;
    while threads <= f.max_num_threads {
        let mut block = f.start_block_size;
        while block <= f.max_block_size {
            let mut batch = f.start_batch_size;
            while batch <= f.max_batch_size {
                let bytes = block.saturating_mul(batch);
                if f.target_range_size != 0 && bytes > f.target_range_size {
                    return Err(bad(format!(
                        "--target_range_size={} is smaller than one operation ({bytes} bytes)",
                        f.target_range_size
                    )));
                }
                let fits = bytes <= f.total_buffer_size / threads as u64
                    && targets
                        .iter()
                        .all(|t| bytes <= t.stride(threads, targets.len()));
                if fits {
                    let s = run_case(f, &engine, &targets, &mut buf, threads, block, batch)?;
                    writeln!(out, "{}", format_row(block, batch, threads, &s)).map_err(io)?;
                    out.flush().map_err(io)?;
                } else {
                    eprintln!("Skipped for block_size {block} batch_size {batch}");
                }
                batch *= 2;
            }
            block *= 2;
        }
        threads *= 2;
    }
    engine.unregister(buf.as_ptr() as usize);
    Ok(())
}

/// An opened target segment and the byte range this initiator may use.
struct Target {
    handle: u64,
    base: u64,
    range: u64,
}

impl Target {
    fn open(engine: &Engine, name: &str, f: &Flags) -> Result<Target> {
        let handle = engine.open(name)?;
        let primary = engine.primary();
        let desc = primary.refresh_segment(primary.open_segment(name)?)?;
        let mut buffers = desc.buffers.clone();
        buffers.sort_by_key(|b| b.addr);
        let b = buffers
            .first()
            .ok_or_else(|| bad(format!("target segment {name} has no registered buffer")))?;
        let range = match f.target_range_size {
            0 => b.length.saturating_sub(f.target_offset),
            r => r,
        };
        if f.target_offset.saturating_add(range) > b.length || range == 0 {
            return Err(bad(format!(
                "--target_offset={} --target_range_size={} is outside the target's {} bytes",
                f.target_offset, f.target_range_size, b.length
            )));
        }
        Ok(Target {
            handle,
            base: b.addr + f.target_offset,
            range,
        })
    }

    /// Bytes each of `threads` spread over `ntargets` targets gets here.
    fn stride(&self, threads: usize, ntargets: usize) -> u64 {
        self.range / threads.div_ceil(ntargets) as u64
    }
}

/// The byte `WriteSeed` stores at remote address `a` (position-dependent,
/// so readers verify whatever range layout they use).
fn seed_byte(a: u64) -> u8 {
    (a ^ (a >> 8) ^ (a >> 17)) as u8
}

fn fill_seed(local: &mut [u8], remote: u64) {
    for (k, b) in local.iter_mut().enumerate() {
        *b = seed_byte(remote + k as u64);
    }
}

fn fill_pattern(local: &mut [u8], round: u64) {
    for (k, b) in local.iter_mut().enumerate() {
        *b = (k as u64 ^ round.wrapping_mul(0x9e37_79b9)) as u8;
    }
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    f: &Flags,
    engine: &Engine,
    targets: &[Target],
    buf: &mut [u8],
    threads: usize,
    block: u64,
    batch: u64,
) -> Result<CaseStats> {
    let stride = buf.len() / threads;
    let barrier = Barrier::new(threads);
    let results: Vec<Result<CaseStats>> = std::thread::scope(|scope| {
        let handles: Vec<_> = buf
            .chunks_mut(stride)
            .take(threads)
            .enumerate()
            .map(|(i, local)| {
                let t = &targets[i % targets.len()];
                let remote = t.base + (i / targets.len()) as u64 * t.stride(threads, targets.len());
                let barrier = &barrier;
                scope.spawn(move || {
                    let w = Worker {
                        f,
                        engine,
                        handle: t.handle,
                        remote,
                        block,
                        batch,
                    };
                    w.run(&mut local[..(block * batch) as usize], barrier)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(bad("a worker thread panicked".into())))
            })
            .collect()
    });
    let mut all = CaseStats::default();
    for r in results {
        all.merge(r?);
    }
    Ok(all)
}

struct Worker<'a> {
    f: &'a Flags,
    engine: &'a Engine,
    handle: u64,
    remote: u64,
    block: u64,
    batch: u64,
}

impl Worker<'_> {
    fn transfer(&self, op: Opcode, local: &mut [u8]) -> Result<f64> {
        let reqs: Vec<TransferRequest> = (0..self.batch)
            .map(|j| TransferRequest {
                opcode: op,
                source: local.as_mut_ptr() as usize + (j * self.block) as usize,
                target_id: self.handle,
                target_offset: self.remote + j * self.block,
                length: self.block as usize,
            })
            .collect();
        let t = Instant::now();
        self.engine.transfer(&reqs)?;
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }

    fn pace(&self) {
        if self.f.request_interval_us > 0 {
            std::thread::sleep(Duration::from_micros(self.f.request_interval_us));
        }
    }

    /// One step of the workload: its transfers' times, or a mismatch error.
    fn step(&self, local: &mut [u8], round: u64, times: &mut Vec<f64>) -> Result<()> {
        let f = self.f;
        match f.op_type {
            OpType::Mix => {
                if f.check_consistency {
                    fill_pattern(local, round);
                }
                self.pace();
                times.push(self.transfer(Opcode::Write, local)?);
                fill_pattern(local, round ^ 0xff);
                self.pace();
                times.push(self.transfer(Opcode::Read, local)?);
                if f.check_consistency {
                    let want: Vec<u8> = {
                        let mut v = vec![0u8; local.len()];
                        fill_pattern(&mut v, round);
                        v
                    };
                    if local != want.as_slice() {
                        return Err(self.mismatch());
                    }
                }
            }
            OpType::ReadVerify => {
                self.pace();
                times.push(self.transfer(Opcode::Read, local)?);
                let ok = local
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == seed_byte(self.remote + k as u64));
                if !ok {
                    return Err(self.mismatch());
                }
            }
            OpType::Read => {
                self.pace();
                times.push(self.transfer(Opcode::Read, local)?);
            }
            OpType::Write | OpType::WriteSeed => {
                self.pace();
                times.push(self.transfer(Opcode::Write, local)?);
            }
        }
        Ok(())
    }

    fn mismatch(&self) -> Error {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "data check failed: the bytes read back at target address {:#x} differ",
                self.remote
            ),
        )
    }

    fn run(&self, local: &mut [u8], barrier: &Barrier) -> Result<CaseStats> {
        if self.f.op_type == OpType::WriteSeed {
            fill_seed(local, self.remote);
        }
        let bytes = local.len() as f64;
        let mut times = Vec::new();
        let start = Instant::now();
        let mut round = 0u64;
        let mut warm = Ok(());
        while warm.is_ok() && start.elapsed() < WARMUP {
            warm = self.step(local, round, &mut times);
            round += 1;
        }
        // Every thread reaches the barrier, even after an error, so none waits forever.
        barrier.wait();
        warm?;
        times.clear();
        let measure = Duration::from_secs(self.f.duration_s);
        let start = Instant::now();
        while start.elapsed() < measure {
            self.step(local, round, &mut times)?;
            round += 1;
        }
        let wall = start.elapsed().as_secs_f64() * 1e6;
        Ok(CaseStats {
            instant_gbps: times.iter().map(|us| bytes / 1e9 / (us / 1e6)).collect(),
            transfer_us: times,
            thread_wall_us: vec![wall],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_bytes_depend_on_the_address_only() {
        let mut a = vec![0u8; 300];
        let mut b = vec![0u8; 100];
        fill_seed(&mut a, 1000);
        fill_seed(&mut b, 1200);
        assert_eq!(&a[200..], &b[..]);
        assert!(a.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn patterns_differ_between_rounds() {
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        fill_pattern(&mut a, 1);
        fill_pattern(&mut b, 1 ^ 0xff);
        assert_ne!(a, b);
    }
}

//! Drain jobs: move every object off some segments before their hosts go
//! down, as the reference's `/api/v1/drain_jobs` does.
//!
//! Creating a job marks its segments DRAINING: they stay readable but take
//! no new replicas, so puts that prefer them land elsewhere. Each timer tick
//! ([`DrainJobs::step`]) then follows the job's move tasks and queues new
//! ones, at most `max_concurrency` at a time: one unit per (object, source
//! segment), moved to the least-used allowed target that holds no replica
//! of the object yet. Hard-pinned objects and objects with a put or
//! transfer in flight are blocked (retried on later ticks); a unit whose
//! task fails three times fails for good. A segment left without objects
//! becomes DRAINED; the job SUCCEEDS when every segment is, and FAILS when
//! only failed units remain. Canceling a job with no task in flight puts
//! its segments back to OK.
//!
//! The job table lives on the leader only (a new leader starts without
//! jobs, and its segments start OK).

use std::collections::{HashMap, HashSet};

use mooncake_common::ErrorCode;
use parking_lot::Mutex;
use serde::Deserialize;

use crate::master::state::service::MasterService;
use crate::master::state::SegmentStatus;
use crate::types::{TaskId, TaskStatus};

/// How often a unit's move may fail before the job gives it up.
const MAX_UNIT_RETRIES: u32 = 3;
/// Jobs kept (finished ones beyond this are forgotten, oldest first).
const MAX_JOBS: usize = 1024;

/// The body of `POST /api/v1/drain_jobs`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct DrainRequest {
    pub(crate) segments: Vec<String>,
    #[serde(default)]
    pub(crate) target_segments: Vec<String>,
    #[serde(default = "default_concurrency")]
    pub(crate) max_concurrency: u32,
}

fn default_concurrency() -> u32 {
    4
}

/// A job's state, with the reference's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobStatus {
    Created = 0,
    Planning = 1,
    Running = 2,
    Succeeded = 3,
    Failed = 4,
    Canceled = 5,
}

impl JobStatus {
    pub(crate) fn name(self) -> &'static str {
        match self {
            JobStatus::Created => "CREATED",
            JobStatus::Planning => "PLANNING",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Canceled => "CANCELED",
        }
    }

    fn finished(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled
        )
    }
}

/// One object's replica on one source segment.
type Unit = (String, String);

struct ActiveUnit {
    unit: Unit,
    bytes: u64,
}

struct Job {
    request: DrainRequest,
    status: JobStatus,
    created_ms: u64,
    updated_ms: u64,
    succeeded: u64,
    failed: u64,
    blocked: u64,
    migrated_bytes: u64,
    message: String,
    active: HashMap<TaskId, ActiveUnit>,
    completed: HashSet<Unit>,
    retries: HashMap<Unit, u32>,
    given_up: HashSet<Unit>,
}

/// What `GET /api/v1/drain_jobs/query` shows of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobView {
    pub(crate) id: u128,
    pub(crate) status: JobStatus,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    pub(crate) segments: Vec<String>,
    pub(crate) succeeded_units: u64,
    pub(crate) failed_units: u64,
    pub(crate) blocked_units: u64,
    pub(crate) active_units: u64,
    pub(crate) migrated_bytes: u64,
    pub(crate) message: String,
}

/// The master's drain jobs.
#[derive(Default)]
pub(crate) struct DrainJobs {
    jobs: Mutex<HashMap<u128, Job>>,
}

/// A job id as the reference prints a UUID.
pub(crate) fn format_job_id(id: u128) -> String {
    let h = format!("{id:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The inverse of [`format_job_id`]; `None` for anything else.
pub(crate) fn parse_job_id(s: &str) -> Option<u128> {
    let parts: Vec<&str> = s.split('-').collect();
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    if lens != [8, 4, 4, 4, 12]
        || !parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return None;
    }
    u128::from_str_radix(&parts.concat(), 16).ok()
}

impl DrainJobs {
    /// Checks the request and marks its segments DRAINING (the reference's
    /// rules: segments given, distinct and OK; targets mounted, allocatable
    /// and not among them; a concurrency above 0).
    pub(crate) fn create(
        &self,
        svc: &MasterService,
        request: DrainRequest,
        wall_ms: u64,
    ) -> Result<u128, ErrorCode> {
        let unique: HashSet<&String> = request.segments.iter().collect();
        if request.segments.is_empty()
            || request.max_concurrency == 0
            || unique.len() != request.segments.len()
        {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        for s in &request.segments {
            match svc.segment_status(s) {
                None => return Err(ErrorCode::SEGMENT_NOT_FOUND),
                Some(SegmentStatus::Ok) => {}
                Some(_) => return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
            }
        }
        for t in &request.target_segments {
            if unique.contains(t) {
                return Err(ErrorCode::INVALID_PARAMS);
            }
            match svc.segment_status(t) {
                None => return Err(ErrorCode::SEGMENT_NOT_FOUND),
                Some(SegmentStatus::Ok) => {}
                Some(_) => return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
            }
        }
        let mut jobs = self.jobs.lock();
        for s in &request.segments {
            svc.set_segment_status(s, SegmentStatus::Draining);
        }
        let id = loop {
            let id: u128 = rand::random();
            if id != 0 && !jobs.contains_key(&id) {
                break id;
            }
        };
        forget_oldest_finished(&mut jobs);
        jobs.insert(
            id,
            Job {
                request,
                status: JobStatus::Created,
                created_ms: wall_ms,
                updated_ms: wall_ms,
                succeeded: 0,
                failed: 0,
                blocked: 0,
                migrated_bytes: 0,
                message: "Drain job created".into(),
                active: HashMap::new(),
                completed: HashSet::new(),
                retries: HashMap::new(),
                given_up: HashSet::new(),
            },
        );
        Ok(id)
    }

    pub(crate) fn query(&self, id: u128) -> Result<JobView, ErrorCode> {
        let jobs = self.jobs.lock();
        let j = jobs.get(&id).ok_or(ErrorCode::JOB_NOT_FOUND)?;
        Ok(JobView {
            id,
            status: j.status,
            created_ms: j.created_ms,
            updated_ms: j.updated_ms,
            segments: j.request.segments.clone(),
            succeeded_units: j.succeeded,
            failed_units: j.failed,
            blocked_units: j.blocked,
            active_units: j.active.len() as u64,
            migrated_bytes: j.migrated_bytes,
            message: j.message.clone(),
        })
    }

    /// Cancels a job that has no move in flight; its segments go back to OK.
    pub(crate) fn cancel(
        &self,
        svc: &MasterService,
        id: u128,
        wall_ms: u64,
    ) -> Result<(), ErrorCode> {
        let mut jobs = self.jobs.lock();
        let j = jobs.get_mut(&id).ok_or(ErrorCode::JOB_NOT_FOUND)?;
        if j.status.finished() || !j.active.is_empty() {
            return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
        }
        j.status = JobStatus::Canceled;
        j.updated_ms = wall_ms;
        j.message = "Drain job canceled".into();
        for s in &j.request.segments {
            svc.set_segment_status(s, SegmentStatus::Ok);
        }
        Ok(())
    }

    /// One round for every unfinished job: follow its tasks, queue more,
    /// and finish it when its segments are empty.
    pub(crate) fn step(&self, svc: &MasterService, now: u64, wall_ms: u64) {
        let mut jobs = self.jobs.lock();
        for job in jobs.values_mut().filter(|j| !j.status.finished()) {
            refresh(job, svc);
            schedule(job, svc, now);
            complete(job, svc);
            job.updated_ms = wall_ms;
        }
    }
}

fn forget_oldest_finished(jobs: &mut HashMap<u128, Job>) {
    while jobs.len() >= MAX_JOBS {
        let oldest = jobs
            .iter()
            .filter(|(_, j)| j.status.finished())
            .min_by_key(|(_, j)| j.updated_ms)
            .map(|(&id, _)| id);
        match oldest {
            Some(id) => jobs.remove(&id),
            None => break,
        };
    }
}

fn fail_once(job: &mut Job, unit: Unit) {
    job.failed += 1;
    let n = job.retries.entry(unit.clone()).or_insert(0);
    *n += 1;
    if *n >= MAX_UNIT_RETRIES {
        job.given_up.insert(unit);
    }
}

/// Counts the job's finished tasks.
fn refresh(job: &mut Job, svc: &MasterService) {
    let ids: Vec<TaskId> = job.active.keys().copied().collect();
    for id in ids {
        let status = svc.query_task(id).map(|t| t.status);
        match status {
            Ok(TaskStatus::Pending | TaskStatus::Processing) => continue,
            Ok(TaskStatus::Success) => {
                let a = job.active.remove(&id).expect("listed above");
                job.succeeded += 1;
                job.migrated_bytes += a.bytes;
                job.completed.insert(a.unit);
            }
            // Failed, or forgotten by the task table.
            _ => {
                let a = job.active.remove(&id).expect("listed above");
                fail_once(job, a.unit);
            }
        }
    }
}

/// The allowed target with the lowest fill that holds no replica of the
/// object yet.
fn pick_target(svc: &MasterService, job: &Job, holders: &[String]) -> Option<String> {
    let candidates = if job.request.target_segments.is_empty() {
        svc.segment_names()
    } else {
        job.request.target_segments.clone()
    };
    candidates
        .into_iter()
        .filter(|c| !holders.contains(c) && !job.request.segments.contains(c))
        .filter(|c| svc.segment_status(c) == Some(SegmentStatus::Ok))
        .filter_map(|c| {
            let (used, cap) = svc.segment_fill(&c)?;
            (cap > 0).then(|| (used as f64 / cap as f64, c))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

fn schedule(job: &mut Job, svc: &MasterService, now: u64) {
    if job.status == JobStatus::Created {
        job.status = JobStatus::Planning;
    }
    let slots = (job.request.max_concurrency.max(1) as usize).saturating_sub(job.active.len());
    let in_flight: HashSet<Unit> = job.active.values().map(|a| a.unit.clone()).collect();
    let mut blocked = 0;
    let mut queued = 0;
    let sources = job.request.segments.clone();
    for obj in svc.objects_on(&sources) {
        for source in obj.segments.iter().filter(|s| sources.contains(s)) {
            let unit = (obj.key.clone(), source.clone());
            if job.completed.contains(&unit)
                || in_flight.contains(&unit)
                || job.given_up.contains(&unit)
            {
                continue;
            }
            if obj.blocked {
                blocked += 1;
                continue;
            }
            let Some(target) = pick_target(svc, job, &obj.segments) else {
                blocked += 1;
                continue;
            };
            if queued == slots {
                continue;
            }
            match svc.create_move_task(&obj.key, source, &target, now) {
                Ok(id) => {
                    queued += 1;
                    job.active.insert(
                        id,
                        ActiveUnit {
                            unit,
                            bytes: obj.size,
                        },
                    );
                }
                Err(e)
                    if matches!(
                        e.code,
                        ErrorCode::NO_AVAILABLE_HANDLE
                            | ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
                            | ErrorCode::OBJECT_HAS_REPLICATION_TASK
                    ) =>
                {
                    blocked += 1
                }
                Err(e) => {
                    tracing::warn!(key = %obj.key, %source, %target, "drain move: {e}");
                    fail_once(job, unit);
                }
            }
        }
    }
    job.blocked = blocked;
    job.status = JobStatus::Running;
    job.message = "Drain job running".into();
}

fn complete(job: &mut Job, svc: &MasterService) {
    if !job.active.is_empty() {
        return;
    }
    let left = svc.objects_on(&job.request.segments);
    let mut remaining: HashSet<&String> = HashSet::new();
    let mut units: Vec<Unit> = Vec::new();
    for obj in &left {
        for s in obj
            .segments
            .iter()
            .filter(|s| job.request.segments.contains(s))
        {
            remaining.insert(s);
            units.push((obj.key.clone(), s.clone()));
        }
    }
    for s in &job.request.segments {
        if !remaining.contains(s) {
            svc.set_segment_status(s, SegmentStatus::Drained);
        }
    }
    if remaining.is_empty() {
        job.status = JobStatus::Succeeded;
        job.message = "Drain job finished successfully".into();
    } else if units.iter().all(|u| job.given_up.contains(u)) {
        job.status = JobStatus::Failed;
        job.message = format!("{} units could not be moved", units.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_print_and_parse_as_uuids() {
        let id = 0x0123_4567_89ab_cdef_0011_2233_4455_6677u128;
        let s = format_job_id(id);
        assert_eq!(s, "01234567-89ab-cdef-0011-223344556677");
        assert_eq!(parse_job_id(&s), Some(id));
        assert_eq!(parse_job_id(&s.to_uppercase()), Some(id));
        for bad in [
            "",
            "abc",
            "01234567-89ab-cdef-0011-22334455667",
            "0123456789abcdef0011223344556677",
            "0123456g-89ab-cdef-0011-223344556677",
        ] {
            assert_eq!(parse_job_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn status_numbers_are_the_references() {
        assert_eq!(JobStatus::Created as i32, 0);
        assert_eq!(JobStatus::Succeeded as i32, 3);
        assert_eq!(JobStatus::Canceled.name(), "CANCELED");
        assert_eq!(SegmentStatus::Ok as i32, 1);
        assert_eq!(SegmentStatus::Draining as i32, 2);
        assert_eq!(SegmentStatus::Drained.name(), "DRAINED");
    }
}

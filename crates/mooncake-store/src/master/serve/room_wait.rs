//! A put refused for lack of room while copies to an SSD tier are under
//! way (or just ended) waits for them to land and tries again
//! (`state::room`), on the connection's thread, instead of answering -200
//! at once.

use std::time::Instant;

use mooncake_common::ErrorCode;

use super::shared::Shared;
use crate::master::state::mutation::Release;
use crate::master::state::room::{next_wait, PUT_ROOM_WAIT};
use crate::master::state::service::Answer;
use crate::proto::{Request, Response};

/// Whether `req` is a put that may wait for room (a copy of it is kept
/// for the retry): single puts and batches, whose refused keys are tried
/// again.
pub(super) fn may_wait(req: &Request<'_>) -> bool {
    matches!(
        req,
        Request::PutStart { .. } | Request::BatchPutStart { .. }
    )
}

fn refused<T>(r: &mooncake_common::Result<T>) -> bool {
    matches!(r, Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE)
}

fn no_room(resp: &Response) -> bool {
    match resp {
        Response::Replicas { result } => refused(result),
        Response::BatchReplicas { results } => results.iter().any(refused),
        _ => false,
    }
}

/// The request to try again after `resp`: the whole put, or the keys of a
/// batch that were refused for room (the others are placed already).
fn again<'a>(req: &Request<'a>, resp: &Response) -> Request<'a> {
    match (req, resp) {
        (
            Request::BatchPutStart {
                client_id,
                keys,
                value_lens,
                config,
                upsert,
            },
            Response::BatchReplicas { results },
        ) => {
            let (keys, value_lens) = keys
                .iter()
                .zip(value_lens)
                .zip(results)
                .filter(|(_, r)| refused(r))
                .map(|((k, l), _)| (*k, *l))
                .unzip();
            Request::BatchPutStart {
                client_id: *client_id,
                keys,
                value_lens,
                config: config.clone(),
                upsert: *upsert,
            }
        }
        _ => req.clone(),
    }
}

/// `next` answered the refused part of `prev`'s batch: the batch's
/// answer with those results put in.
fn merge(prev: Response, next: Response) -> Response {
    match (prev, next) {
        (Response::BatchReplicas { mut results }, Response::BatchReplicas { results: redone }) => {
            let mut redone = redone.into_iter();
            for r in results.iter_mut().filter(|r| refused(r)) {
                match redone.next() {
                    Some(n) => *r = n,
                    None => break,
                }
            }
            Response::BatchReplicas { results }
        }
        (_, next) => next,
    }
}

/// `first` answered `req`, tried when the count of ended copies was
/// `seen`; while it is a refusal for room and copies are under way (or
/// one ended since the try began), waits for one to land and asks again,
/// within [`PUT_ROOM_WAIT`]. The answer keeps the latest log position any
/// try reached (a failed try may have logged evictions).
pub(super) fn until_room(
    shared: &Shared,
    req: Request<'_>,
    tenant: &str,
    first: Answer,
    mut seen: u64,
) -> Answer {
    let service = &shared.service;
    let signal = service.room_signal();
    let started = Instant::now();
    let mut answer = first;
    loop {
        let (count, under_way) = signal.look(|| service.copies_under_way());
        let ended = count != seen;
        let wait = next_wait(
            no_room(&answer.response),
            under_way || ended,
            started.elapsed(),
            PUT_ROOM_WAIT,
        );
        let Some(wait) = wait else { return answer };
        if !ended {
            signal.wait_past(seen, wait);
        }
        seen = signal.generation();
        let now = shared.clock.now_ms();
        let next = service.handle_as(again(&req, &answer.response), tenant, now);
        let release = later(answer.release, next.release);
        answer = Answer {
            response: merge(answer.response, next.response),
            release,
        };
    }
}

/// The release covering both: the later position (positions only grow;
/// one master logs either to a WAL or to its standbys).
fn later(a: Release, b: Release) -> Release {
    match (a, b) {
        (Release::Now, b) => b,
        (a, Release::Now) => a,
        (a, b) if b.position() >= a.position() => b,
        (a, _) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::Error;

    fn full() -> mooncake_common::Result<Vec<crate::types::ReplicaDesc>> {
        Err(Error::new(ErrorCode::NO_AVAILABLE_HANDLE, "full"))
    }

    #[test]
    fn a_batch_tries_again_only_its_refused_keys_and_keeps_the_others() {
        let req = Request::BatchPutStart {
            client_id: 1,
            keys: vec!["a", "b", "c"],
            value_lens: vec![1, 2, 3],
            config: Default::default(),
            upsert: false,
        };
        let first = Response::BatchReplicas {
            results: vec![Ok(vec![]), full(), full()],
        };
        assert!(no_room(&first));
        match again(&req, &first) {
            Request::BatchPutStart {
                keys, value_lens, ..
            } => {
                assert_eq!(keys, vec!["b", "c"]);
                assert_eq!(value_lens, vec![2, 3]);
            }
            other => panic!("{other:?}"),
        }
        let second = Response::BatchReplicas {
            results: vec![Ok(vec![]), full()],
        };
        let merged = merge(first, second);
        match &merged {
            Response::BatchReplicas { results } => {
                assert!(results[0].is_ok() && results[1].is_ok() && refused(&results[2]));
            }
            other => panic!("{other:?}"),
        }
        assert!(no_room(&merged), "c still waits");
        let single = Response::Replicas { result: full() };
        assert!(no_room(&single));
        assert!(!no_room(&Response::Replicas { result: Ok(vec![]) }));
    }

    #[test]
    fn the_answer_waits_for_the_latest_position_of_its_tries() {
        assert_eq!(
            later(Release::Now, Release::Durable(3)),
            Release::Durable(3)
        );
        assert_eq!(
            later(Release::Durable(3), Release::Now),
            Release::Durable(3)
        );
        assert_eq!(
            later(Release::Durable(3), Release::Durable(5)),
            Release::Durable(5)
        );
        assert_eq!(
            later(Release::Committed(7), Release::Committed(4)),
            Release::Committed(7)
        );
    }
}

//! The write command every put and upsert becomes at the client's edge.

use crate::types::WriteOptions;

/// Where a write's bytes come from, as the caller handed them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Caller bytes: `put`, `put_parts`, `put_batch`.
    Bytes,
    /// Registered or pool memory: the `*_from` calls, and a dummy's writes,
    /// which its service reads from the memory they share.
    Mem,
}

/// One write command from the caller's edge to a
/// [`ClientImpl`](super::ClientImpl): how to store the values (`opts`: put
/// or upsert, placement) and where they come from, which together name the
/// call in the metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteCmd<'o> {
    pub opts: &'o WriteOptions,
    pub source: Source,
}

impl WriteCmd<'_> {
    /// The `op_name` this command is counted under when it writes `keys`
    /// keys: the one-key call's name, or its batch form for any other count.
    pub(crate) fn op_name(&self, keys: usize) -> &'static str {
        match (self.opts.upsert, self.source, keys == 1) {
            (false, Source::Bytes, true) => "put",
            (false, Source::Bytes, false) => "put_batch",
            (false, Source::Mem, true) => "put_from",
            (false, Source::Mem, false) => "batch_put_from",
            (true, Source::Bytes, true) => "upsert",
            (true, Source::Bytes, false) => "upsert_batch",
            (true, Source::Mem, true) => "upsert_from",
            (true, Source::Mem, false) => "batch_upsert_from",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ReplicaPolicy;

    #[test]
    fn a_command_names_the_call_it_came_in_as() {
        let cfg = ReplicaPolicy::default();
        let (put, upsert) = (WriteOptions::put(&cfg), WriteOptions::upsert(&cfg));
        let name = |opts, source, keys| WriteCmd { opts, source }.op_name(keys);
        assert_eq!(name(&put, Source::Bytes, 1), "put");
        assert_eq!(name(&put, Source::Bytes, 3), "put_batch");
        assert_eq!(name(&put, Source::Mem, 1), "put_from");
        assert_eq!(name(&put, Source::Mem, 2), "batch_put_from");
        assert_eq!(name(&upsert, Source::Bytes, 1), "upsert");
        assert_eq!(name(&upsert, Source::Bytes, 2), "upsert_batch");
        assert_eq!(name(&upsert, Source::Mem, 1), "upsert_from");
        assert_eq!(name(&upsert, Source::Mem, 0), "batch_upsert_from");
    }
}

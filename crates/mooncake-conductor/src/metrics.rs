//! The service's Prometheus metrics (`GET /metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `instance|tenant|dp_rank|type`.
    pub publisher: String,
    /// `stored`, `removed`, `cleared`, `malformed` (did not decode) or
    /// `rejected` (decoded, could not be placed).
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PublisherLabels {
    pub publisher: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplayLabels {
    pub publisher: String,
    /// `recovered` or `failed`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    pub endpoint: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub events: Family<EventLabels, Counter>,
    pub batches: Family<PublisherLabels, Counter>,
    pub bad_batches: Family<PublisherLabels, Counter>,
    pub gaps: Family<PublisherLabels, Counter>,
    pub replays: Family<ReplayLabels, Counter>,
    pub index_blocks: Gauge,
    pub index_bytes: Gauge,
    pub query_latency: Family<QueryLabels, Histogram>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("conductor");
        let events = Family::<EventLabels, Counter>::default();
        let batches = Family::<PublisherLabels, Counter>::default();
        let bad_batches = Family::<PublisherLabels, Counter>::default();
        let gaps = Family::<PublisherLabels, Counter>::default();
        let replays = Family::<ReplayLabels, Counter>::default();
        let index_blocks = Gauge::default();
        let index_bytes = Gauge::default();
        // 10 µs .. ~80 ms.
        let query_latency = Family::<QueryLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1e-5, 2.0, 14,
            ))
        });
        registry.register(
            "events",
            "KV events ingested, by publisher and kind",
            events.clone(),
        );
        registry.register(
            "batches",
            "Event batches received, by publisher",
            batches.clone(),
        );
        registry.register(
            "undecodable_batches",
            "Batches whose payload did not decode",
            bad_batches.clone(),
        );
        registry.register(
            "sequence_gaps",
            "Gaps in a publisher's batch sequence numbers",
            gaps.clone(),
        );
        registry.register(
            "replays",
            "Replay requests after a gap, by outcome",
            replays.clone(),
        );
        registry.register(
            "index_blocks",
            "Distinct blocks indexed",
            index_blocks.clone(),
        );
        registry.register(
            "index_bytes",
            "Estimated heap bytes of the index",
            index_bytes.clone(),
        );
        registry.register(
            "query_latency_seconds",
            "Server-side time to answer a query",
            query_latency.clone(),
        );
        Metrics {
            registry,
            events,
            batches,
            bad_batches,
            gaps,
            replays,
            index_blocks,
            index_bytes,
            query_latency,
        }
    }
}

impl Metrics {
    pub fn event(&self, publisher: &str, kind: &str, n: u64) {
        if n > 0 {
            self.events
                .get_or_create(&EventLabels {
                    publisher: publisher.to_string(),
                    kind: kind.to_string(),
                })
                .inc_by(n);
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

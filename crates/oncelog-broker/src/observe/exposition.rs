//! The `/metrics` exposition: the families a scrape gathers
//! ([`crate::observe::metrics`]), written by prometheus-client's encoder
//! of the Prometheus text format (version 0.0.4), which names, escapes
//! and formats every sample.
//!
//! A scrape reads the broker's state asynchronously (partitions, the
//! coordinators, PostgreSQL in cluster mode), so it gathers its values
//! into a [`Scrape`] first; the encoder then writes them in one pass
//! ([`Collector`] over constant values).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::observe::histogram::Histogram;

/// The content type of what [`Scrape::encode`] writes.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

type Labels = Vec<(String, String)>;

#[derive(Debug)]
enum Value {
    Int(i64),
    Float(f64),
    Histogram {
        sum: f64,
        count: u64,
        /// (upper bound, observations in this bucket alone)
        buckets: Vec<(f64, u64)>,
    },
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// The families of one scrape, in the order they were added.
#[derive(Debug, Default)]
pub struct Scrape {
    families: Vec<Family>,
}

/// One family of a [`Scrape`], taking its samples.
pub struct Samples<'a>(&'a mut Family);

impl Scrape {
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> Samples<'_> {
        self.families.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            samples: Vec::new(),
        });
        let last = self.families.len() - 1;
        Samples(&mut self.families[last])
    }

    pub fn gauge(&mut self, name: &str, help: &str) -> Samples<'_> {
        self.family(name, help, MetricType::Gauge)
    }

    /// A counter; `name` ends in `_total`, as the exposition names it (the
    /// encoder adds the suffix to the family's name).
    pub fn counter(&mut self, name: &str, help: &str) -> Samples<'_> {
        let base = name.strip_suffix("_total").unwrap_or(name);
        self.family(base, help, MetricType::Counter)
    }

    pub fn histogram(&mut self, name: &str, help: &str) -> Samples<'_> {
        self.family(name, help, MetricType::Histogram)
    }

    /// The exposition text.
    pub fn encode(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::with_capacity(8192);
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "encoding /metrics failed");
        }
        out
    }
}

fn labels(l: &[(&str, &str)]) -> Labels {
    l.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Samples<'_> {
    /// A sample of whole numbers (a count, an offset).
    pub fn int(&mut self, l: &[(&str, &str)], v: i64) -> &mut Self {
        self.0.samples.push((labels(l), Value::Int(v)));
        self
    }

    pub fn float(&mut self, l: &[(&str, &str)], v: f64) -> &mut Self {
        self.0.samples.push((labels(l), Value::Float(v)));
        self
    }

    /// A histogram's buckets, sum and count as they are now.
    pub fn histogram(&mut self, l: &[(&str, &str)], h: &Histogram) -> &mut Self {
        let buckets = h.buckets();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let v = Value::Histogram {
            sum: h.sum(),
            count,
            buckets,
        };
        self.0.samples.push((labels(l), v));
        self
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let mut family = encoder.encode_descriptor(&f.name, &f.help, None, f.kind)?;
            for (labels, v) in &f.samples {
                let mut m = family.encode_family(labels)?;
                match (v, f.kind) {
                    (Value::Int(n), MetricType::Counter) => {
                        m.encode_counter::<NoLabelSet, _, f64>(&(*n).max(0).unsigned_abs(), None)?
                    }
                    (Value::Float(x), MetricType::Counter) => {
                        m.encode_counter::<NoLabelSet, _, f64>(x, None)?
                    }
                    (Value::Int(n), _) => m.encode_gauge(n)?,
                    (Value::Float(x), _) => m.encode_gauge(x)?,
                    (
                        Value::Histogram {
                            sum,
                            count,
                            buckets,
                        },
                        _,
                    ) => m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_in_the_prometheus_text_format() {
        let mut s = Scrape::default();
        s.gauge("g", "A gauge.")
            .int(&[("topic", "a\"b"), ("partition", "0")], 7)
            .int(&[], -1);
        s.counter("c_total", "A counter.")
            .int(&[("cause", "timeout")], 3);
        s.counter("t_seconds_total", "Time.").float(&[], 1.5);
        let h = Histogram::size();
        h.observe(5000.0);
        s.histogram("h", "Sizes.").histogram(&[], &h);
        let out = s.encode();
        for want in [
            "# HELP g A gauge.\n# TYPE g gauge\n",
            "g{topic=\"a\\\"b\",partition=\"0\"} 7\n",
            "g -1\n",
            "# TYPE c_total counter\nc_total{cause=\"timeout\"} 3\n",
            "t_seconds_total 1.5\n",
            "h_bucket{le=\"4096\"} 0\n",
            "h_bucket{le=\"16384\"} 1\n",
            "h_bucket{le=\"+Inf\"} 1\n",
            "h_sum 5000",
            "h_count 1\n",
        ] {
            assert!(out.contains(want), "{want:?} not in\n{out}");
        }
    }
}

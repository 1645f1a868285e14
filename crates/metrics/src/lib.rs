//! Prometheus metrics of the daemons (docs/design/operations.md, "Metrics").
//!
//! - [`Exposition`] writes the text exposition format (version 0.0.4): `# HELP`, `# TYPE`, one
//!   line per sample, label values escaped;
//! - [`Histogram`] counts durations into fixed buckets with atomics (no lock on the request path);
//! - [`serve`] answers `GET /metrics` on its own TCP listener, one connection at a time with
//!   short timeouts, so a scraper can neither pile up threads nor hold the daemon.
//!
//! The daemons render their own samples (`spillway-server`, `spillway-manager`); this crate
//! knows nothing of them.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Request head bytes read before the request is refused.
const REQUEST_HEAD_BYTES_MAX: usize = 8192;
/// How long a scraper may take to send its request, and to read the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Upper bounds of the latency buckets, in seconds (100 µs to 10 s; `+Inf` is implied).
pub const LATENCY_BUCKETS_SECONDS: [f64; 12] =
    [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0];

/// One sample's labels, `(name, value)`.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// A text exposition being written.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        debug_assert!(valid_name(name), "metric name {name:?}");
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: Labels<'_>, value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (index, (label, value)) in labels.iter().enumerate() {
                if index > 0 {
                    self.text.push(',');
                }
                debug_assert!(valid_name(label), "label name {label:?}");
                let _ = write!(self.text, "{label}=\"{}\"", escape_label_value(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", format_value(value));
    }

    /// A counter (only goes up while the process lives).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, help, "counter");
        self.sample(name, &[], value as f64);
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.gauge_family(name, help, &[(&[], value)]);
    }

    /// A gauge with one sample per label set.
    pub fn gauge_family(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, f64)]) {
        self.header(name, help, "gauge");
        for (labels, value) in samples {
            self.sample(name, labels, *value);
        }
    }

    /// A histogram with one series per label set (`le` buckets, `_sum`, `_count`).
    pub fn histogram_family(
        &mut self,
        name: &str,
        help: &str,
        series: &[(Labels<'_>, &Histogram)],
    ) {
        self.header(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (labels, histogram) in series {
            let snapshot = histogram.snapshot();
            let mut cumulative = 0u64;
            for (bound, count) in LATENCY_BUCKETS_SECONDS.iter().zip(&snapshot.counts) {
                cumulative += count;
                let le = format_value(*bound);
                let mut with_le: Vec<(&str, &str)> = labels.to_vec();
                with_le.push(("le", &le));
                self.sample(&bucket, &with_le, cumulative as f64);
            }
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", "+Inf"));
            self.sample(&bucket, &with_le, snapshot.count as f64);
            self.sample(&format!("{name}_sum"), labels, snapshot.sum_seconds);
            self.sample(&format!("{name}_count"), labels, snapshot.count as f64);
        }
    }

    pub fn finish(self) -> String {
        self.text
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Backslash, double quote and line feed escaped, as the format requires.
fn escape_label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{value}")
    }
}

/// Durations counted into [`LATENCY_BUCKETS_SECONDS`].
#[derive(Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last counts what exceeds every bound.
    counts: [AtomicU64; LATENCY_BUCKETS_SECONDS.len() + 1],
    sum_nanos: AtomicU64,
}

/// What a histogram holds at one time.
pub struct HistogramSnapshot {
    /// Per bucket of [`LATENCY_BUCKETS_SECONDS`], not cumulative (above the last: not here).
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS_SECONDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS_SECONDS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let all: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        HistogramSnapshot {
            counts: all[..LATENCY_BUCKETS_SECONDS.len()].to_vec(),
            count: all.iter().sum(),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// Renders the current samples; called once per scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A `/metrics` listener; stops when dropped.
pub struct MetricsServer {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Where it listens (the real port when port 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves `GET /metrics` on `address` (`host:port`) from a thread of its own.
pub fn serve(address: &str, render: Render) -> std::io::Result<MetricsServer> {
    let listener = TcpListener::bind(address)?;
    let address = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::Builder::new().name("spillway-metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            if stopping.load(Ordering::SeqCst) {
                break;
            }
            match stream {
                Ok(stream) => {
                    if let Err(error) = answer(stream, &render) {
                        tracing::debug!(%error, "metrics: a scrape failed");
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "metrics: accept failed");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    })?;
    Ok(MetricsServer { address, stop, thread: Some(thread) })
}

fn answer(mut stream: TcpStream, render: &Render) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CONNECTION_TIMEOUT))?;
    stream.set_write_timeout(Some(CONNECTION_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > REQUEST_HEAD_BYTES_MAX {
            return reply(&mut stream, "431 Request Header Fields Too Large", "text/plain", b"");
        }
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|b| *b == b' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET", b"/metrics") => reply(&mut stream, "200 OK", CONTENT_TYPE, render().as_bytes()),
        (b"GET", _) => reply(&mut stream, "404 Not Found", "text/plain", b"only /metrics here\n"),
        _ => reply(&mut stream, "405 Method Not Allowed", "text/plain", b"GET only\n"),
    }
}

fn reply(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_has_help_type_escaped_labels_and_cumulative_buckets() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(50));
        histogram.observe(Duration::from_millis(3));
        histogram.observe(Duration::from_secs(20));
        let mut out = Exposition::new();
        out.counter("spillway_test_bytes_total", "Bytes.\nTwo lines", 42);
        out.gauge_family(
            "spillway_test_used_bytes",
            "Used.",
            &[(&[("reservation", "a\"b\\c\nd")], 1.5), (&[("reservation", "plain")], 0.0)],
        );
        out.histogram_family(
            "spillway_test_seconds",
            "Latency.",
            &[(&[("kind", "write")], &histogram)],
        );
        let text = out.finish();
        assert!(text.contains("# HELP spillway_test_bytes_total Bytes.\\nTwo lines\n"), "{text}");
        assert!(text
            .contains("# TYPE spillway_test_bytes_total counter\nspillway_test_bytes_total 42\n"));
        assert!(
            text.contains("spillway_test_used_bytes{reservation=\"a\\\"b\\\\c\\nd\"} 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("spillway_test_seconds_bucket{kind=\"write\",le=\"0.0001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("spillway_test_seconds_bucket{kind=\"write\",le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("spillway_test_seconds_bucket{kind=\"write\",le=\"10\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("spillway_test_seconds_bucket{kind=\"write\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("spillway_test_seconds_count{kind=\"write\"} 3\n"), "{text}");
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("spillway_test_seconds_sum{kind=\"write\"} "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 20.00305).abs() < 1e-9, "{sum}");
    }

    fn get(address: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn the_listener_answers_metrics_refuses_the_rest_and_stops_when_dropped() {
        let server = serve("127.0.0.1:0", Arc::new(|| "up 1\n".to_string())).unwrap();
        let address = server.local_addr();
        let ok = get(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE) && ok.ends_with("\r\n\r\nup 1\n"), "{ok}");
        assert!(get(address, "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(address, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        // A head that never ends, all of it read by the server (so its close is not a reset).
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}", "a".repeat(9000 - 25));
        let mut stream = TcpStream::connect(address).unwrap();
        let _ = stream.write_all(huge.as_bytes());
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        drop(server);
        assert!(TcpStream::connect(address).is_err(), "still listening after drop");
    }
}

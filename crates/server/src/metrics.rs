//! Prometheus metrics of the server: request and token counters, TTFT and inter-token latency histograms, queue depth, draft tokens of speculative decoding.
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const ITL_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];

struct Histogram {
    buckets: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Histogram {
        Histogram { buckets, counts: vec![0; buckets.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.buckets.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.buckets.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", self.count, self.sum, self.count);
    }
}

struct Inner {
    requests: BTreeMap<(&'static str, u16), u64>,
    prompt_tokens: u64,
    generation_tokens: u64,
    ttft: Histogram,
    itl: Histogram,
    queued: i64,
    running: i64,
    sequences: usize,
    kv_blocks: usize,
    prefix_blocks: usize,
    prefix_hits: u64,
    prefix_tokens: u64,
    draft_proposed: u64,
    draft_accepted: u64,
}

/// Shared by the HTTP handlers and the engine thread.
pub struct Metrics(Mutex<Inner>);

impl Default for Metrics {
    fn default() -> Self {
        Metrics(Mutex::new(Inner {
            requests: BTreeMap::new(),
            prompt_tokens: 0,
            generation_tokens: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            queued: 0,
            running: 0,
            sequences: 0,
            kv_blocks: 0,
            prefix_blocks: 0,
            prefix_hits: 0,
            prefix_tokens: 0,
            draft_proposed: 0,
            draft_accepted: 0,
        }))
    }
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g);
    }

    /// One answered request on `endpoint` with HTTP `status`.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        self.with(|m| *m.requests.entry((endpoint, status)).or_default() += 1);
    }
    pub fn prompt_tokens(&self, n: usize) {
        self.with(|m| m.prompt_tokens += n as u64);
    }
    pub fn generated_token(&self, since_last: Option<f64>) {
        self.with(|m| {
            m.generation_tokens += 1;
            if let Some(dt) = since_last {
                m.itl.observe(dt);
            }
        });
    }
    pub fn ttft(&self, seconds: f64) {
        self.with(|m| m.ttft.observe(seconds));
    }
    /// Queue depth changes: `queued` waiting requests, `running` ones being generated.
    pub fn queue(&self, queued: i64, running: i64) {
        self.with(|m| {
            m.queued += queued;
            m.running += running;
        });
    }

    /// A request started with `cached` prompt tokens taken from the prefix cache.
    pub fn prefix(&self, cached: usize) {
        self.with(|m| {
            if cached > 0 {
                m.prefix_hits += 1;
                m.prefix_tokens += cached as u64;
            }
        });
    }
    /// The running batch: sequences in it, KV blocks they reserve, blocks the prefix cache holds.
    pub fn batch(&self, sequences: usize, kv_blocks: usize, prefix_blocks: usize) {
        self.with(|m| {
            m.sequences = sequences;
            m.kv_blocks = kv_blocks;
            m.prefix_blocks = prefix_blocks;
        });
    }
    /// A choice ended with `proposed` draft tokens proposed to the model, `accepted` of them taken.
    pub fn drafted(&self, proposed: usize, accepted: usize) {
        self.with(|m| {
            m.draft_proposed += proposed as u64;
            m.draft_accepted += accepted as u64;
        });
    }
    /// Requests waiting for the engine.
    pub fn queued(&self) -> i64 {
        let mut q = 0;
        self.with(|m| q = m.queued);
        q
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.with(|m| {
            out.push_str("# HELP mlxgen_requests_total HTTP requests answered, by endpoint and status.\n# TYPE mlxgen_requests_total counter\n");
            for ((e, s), n) in &m.requests {
                let _ = writeln!(out, "mlxgen_requests_total{{endpoint=\"{e}\",status=\"{s}\"}} {n}");
            }
            let _ = writeln!(out, "# HELP mlxgen_prompt_tokens_total Prompt tokens processed.\n# TYPE mlxgen_prompt_tokens_total counter\nmlxgen_prompt_tokens_total {}", m.prompt_tokens);
            let _ = writeln!(out, "# HELP mlxgen_generation_tokens_total Tokens generated.\n# TYPE mlxgen_generation_tokens_total counter\nmlxgen_generation_tokens_total {}", m.generation_tokens);
            m.ttft.render("mlxgen_time_to_first_token_seconds", "Time from a request's arrival to its first token.", &mut out);
            m.itl.render("mlxgen_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", &mut out);
            let _ = writeln!(out, "# HELP mlxgen_queue_depth Requests waiting for the engine.\n# TYPE mlxgen_queue_depth gauge\nmlxgen_queue_depth {}", m.queued);
            let _ = writeln!(out, "# HELP mlxgen_running_requests Requests being generated.\n# TYPE mlxgen_running_requests gauge\nmlxgen_running_requests {}", m.running);
            let _ = writeln!(out, "# HELP mlxgen_running_sequences Sequences in the running batch (a request's choices each count).\n# TYPE mlxgen_running_sequences gauge\nmlxgen_running_sequences {}", m.sequences);
            let _ = writeln!(out, "# HELP mlxgen_kv_blocks_in_use KV cache blocks (16 positions) reserved by running sequences.\n# TYPE mlxgen_kv_blocks_in_use gauge\nmlxgen_kv_blocks_in_use {}", m.kv_blocks);
            let _ = writeln!(out, "# HELP mlxgen_prefix_cache_blocks Blocks of finished sequences kept for prefix reuse.\n# TYPE mlxgen_prefix_cache_blocks gauge\nmlxgen_prefix_cache_blocks {}", m.prefix_blocks);
            let _ = writeln!(out, "# HELP mlxgen_prefix_cache_hits_total Requests whose prompt began with cached tokens.\n# TYPE mlxgen_prefix_cache_hits_total counter\nmlxgen_prefix_cache_hits_total {}", m.prefix_hits);
            let _ = writeln!(out, "# HELP mlxgen_prefix_cached_tokens_total Prompt tokens taken from the prefix cache.\n# TYPE mlxgen_prefix_cached_tokens_total counter\nmlxgen_prefix_cached_tokens_total {}", m.prefix_tokens);
            let _ = writeln!(out, "# HELP mlxgen_draft_tokens_proposed_total Draft tokens proposed to the model by speculative decoding (ended choices).\n# TYPE mlxgen_draft_tokens_proposed_total counter\nmlxgen_draft_tokens_proposed_total {}", m.draft_proposed);
            let _ = writeln!(out, "# HELP mlxgen_draft_tokens_accepted_total Draft tokens the model accepted (ended choices).\n# TYPE mlxgen_draft_tokens_accepted_total counter\nmlxgen_draft_tokens_accepted_total {}", m.draft_accepted);
        });
        out
    }
}

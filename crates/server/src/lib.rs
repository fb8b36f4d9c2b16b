//! mlx-gen's HTTP server (OpenAI's and Anthropic's APIs): axum handlers on tokio, one engine thread that owns the model.
#![forbid(unsafe_code)]
pub mod anthropic;
pub mod api;
pub mod constrain;
pub mod health;
pub mod lockstep;
pub mod metrics;
pub mod outbox;
pub mod prepare;
pub mod reasoning;
pub mod replica;
mod routes;
pub mod stop;
pub mod structured;
pub mod tools;
mod trace;
pub mod worker;

use anyhow::{Context, Result};
use engine::LoadedModel;
use std::sync::Arc;

/// The models a server loads: the one it serves, and the draft model of `serve --draft-model`.
pub struct Models {
    pub model: LoadedModel,
    pub draft: Option<LoadedModel>,
}

/// What `mlx-gen serve` was asked for.
#[derive(Clone)]
pub struct ServeOptions {
    /// The id `/v1/models` lists and requests may name.
    pub model_id: String,
    pub host: String,
    pub port: u16,
    /// With a key, every route but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Request bodies larger than this are refused (413).
    pub max_body_bytes: usize,
    /// Requests waiting for the engine at most; more are refused (503 with Retry-After).
    pub max_queue: usize,
    /// A request still running this long after it arrived ends with a 408 (`None`: no limit).
    pub request_timeout: Option<std::time::Duration>,
    /// An engine step running longer than this makes `/health` answer 503 (stuck).
    pub step_timeout: std::time::Duration,
    pub batch: lockstep::BatchOptions,
    /// With several ranks (rank 0 serves): how rank 0 hands its engine calls to the others.
    pub share: Option<lockstep::Share>,
}

/// Serves the model `load` makes (on the engine thread, which owns it and its draft model) until Ctrl-C (or SIGTERM),
/// then lets running requests finish and returns. A load failure is returned before anything
/// listens. If the engine thread dies, `/health` answers 503 with the reason for a moment, then the
/// server shuts down and the error is returned (the process exits non-zero, for a supervisor to
/// restart it).
pub fn serve(load: impl FnOnce() -> Result<Models> + Send + 'static, options: ServeOptions) -> Result<()> {
    let metrics = Arc::new(metrics::Metrics::default());
    let health = Arc::new(health::EngineHealth::new(options.step_timeout));
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (engine, preparer) = worker::spawn(Box::new(load), jobs_rx, metrics.clone(), health.clone(), stopping.clone(), options.batch.clone(), options.share.clone())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let addr = format!("{}:{}", options.host, options.port);
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        // The handlers are in place before the address is announced: a signal right after it is
        // a clean shutdown, not the default death.
        let signals = Signals::install()?;
        eprintln!("mlx-gen serving {} on http://{local} (Ctrl-C stops)", options.model_id);
        let app = routes::router(routes::AppState { jobs: jobs_tx, preparer: Arc::new(preparer), metrics, health: health.clone(), options: Arc::new(options) });
        let stop = shutdown_signal(signals, stopping, health.clone());
        axum::serve(listener, app).with_graceful_shutdown(stop).await.context("the server failed")
    })?;
    drop(runtime);
    let _ = engine.join();
    match health.dead() {
        Some(reason) => anyhow::bail!("{reason}; the server stopped"),
        None => Ok(()),
    }
}

/// Ctrl-C and SIGTERM, listened for from the moment they are installed.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                int: signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?,
                term: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            let int = std::pin::pin!(self.int.recv());
            let term = std::pin::pin!(self.term.recv());
            let _ = futures_util::future::select(int, term).await;
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Resolves at Ctrl-C or SIGTERM, after telling the engine thread to end running jobs; or a moment
/// after the engine thread died (while `/health` says why), with a forced exit should open
/// connections keep the shutdown waiting.
async fn shutdown_signal(mut signals: Signals, stopping: Arc<std::sync::atomic::AtomicBool>, health: Arc<health::EngineHealth>) {
    let died = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if let Some(reason) = health.dead() {
                return reason;
            }
        }
    };
    let signal = std::pin::pin!(signals.recv());
    let died = std::pin::pin!(died);
    match futures_util::future::select(signal, died).await {
        futures_util::future::Either::Left(_) => eprintln!("shutting down"),
        futures_util::future::Either::Right((reason, _)) => {
            eprintln!("error: {reason}; the server stops (exit status 1) so that a supervisor can restart it");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            std::thread::spawn(|| {
                std::thread::sleep(std::time::Duration::from_secs(10));
                eprintln!("error: the shutdown did not finish within 10 s");
                std::process::exit(1);
            });
        }
    }
    stopping.store(true, std::sync::atomic::Ordering::Relaxed);
}

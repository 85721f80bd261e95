//! The REST API's routes (axum) and its server: reads answer from the [`JobClient`]'s view and
//! statistics; triggers go through the client as asynchronous operations with a trigger id,
//! as Flink's. Every error is a JSON `{"errors": [..]}` with a 4xx or 5xx status, never a panic.

use super::operations::{Kind, Operation, Operations, retrying};
use super::rates::{self, Rates, VertexRate};
use super::{RestOptions, RestServer, metrics, views, web};
use crate::error::JobError;
use crate::job::JobClient;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use tracing::{info, warn};
use weir_core::config::CheckpointTuning;

/// A request body larger than this is refused.
const BODY_LIMIT: usize = 64 * 1024;

/// How long the server outlives its job while a finished operation's result is unread.
const LINGER: std::time::Duration = std::time::Duration::from_secs(5);

struct Shared {
    client: JobClient,
    read_only: bool,
    /// Checkpoints, savepoints and stops triggered here.
    operations: Operations,
    /// The vertices' counters of the last seconds, for their rates.
    rates: Rates,
}

/// Each vertex's counters now and its rates over the last seconds.
pub(super) type VertexFigures =
    std::collections::BTreeMap<u32, (crate::job::VertexSample, VertexRate)>;

fn vertex_figures(s: &Shared) -> VertexFigures {
    let now = s.client.vertex_metrics();
    let rates = s.rates.rates(&now, now_ms());
    now.into_iter()
        .map(|(v, sample)| {
            let rate = rates.get(&v).cloned().unwrap_or_default();
            (v, (sample, rate))
        })
        .collect()
}

type AppState = Arc<Shared>;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "errors": [message.into()] }))).into_response()
}

/// A request that cannot be answered: its status and why.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn fail(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

fn ok(value: Value) -> Response {
    axum::Json(value).into_response()
}

fn now_ms() -> u64 {
    weir_core::sim::wall_clock().as_millis() as u64
}

/// Binds the first free port of `options` and serves until stopped.
pub(super) async fn serve(
    options: &RestOptions,
    client: JobClient,
) -> Result<RestServer, JobError> {
    let listener = bind(options).await?;
    let address = listener
        .local_addr()
        .map_err(|e| JobError::Invalid(format!("the REST API's address: {e}")))?;
    // Another job on the machine may hold the asked port: the address taken is in the view.
    info!(asked = %options.address, %address, "REST API listening");
    client.update_view(|v| v.rest_address = Some(address.to_string()));
    let shared = Arc::new(Shared {
        client,
        read_only: options.read_only,
        operations: Operations::default(),
        rates: Rates::default(),
    });
    let app = router(shared.clone());
    let sampled = shared.clone();
    let sampler = tokio::spawn(async move {
        let mut every = tokio::time::interval(rates::SAMPLE_EVERY);
        loop {
            every.tick().await;
            sampled.rates.sample(&sampled.client, now_ms());
        }
    });
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
                // The job ended: serve on until every ended operation's result was fetched,
                // for at most LINGER.
                let deadline = tokio::time::Instant::now() + LINGER;
                while shared.operations.any_unread() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            })
            .await;
        sampler.abort();
        if let Err(e) = served {
            warn!(error = %e, "the REST API stopped");
        }
    });
    Ok(RestServer { shutdown, task })
}

async fn bind(options: &RestOptions) -> Result<tokio::net::TcpListener, JobError> {
    let mut address = options.address;
    let mut last = None;
    for attempt in 0..=options.port_attempts {
        match tokio::net::TcpListener::bind(address).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        if address.port() == 0 {
            break;
        }
        address.set_port(
            if attempt == options.port_attempts || address.port() == u16::MAX {
                0
            } else {
                address.port() + 1
            },
        );
        if attempt == options.port_attempts
            && options.port_attempts > 0
            && let Ok(l) = tokio::net::TcpListener::bind(address).await
        {
            return Ok(l);
        }
    }
    Err(JobError::Invalid(format!(
        "the REST API cannot listen on {}: {}",
        options.address,
        last.map_or_else(|| "no port".to_string(), |e| e.to_string())
    )))
}

fn router(shared: AppState) -> Router {
    Router::new()
        .route("/overview", get(overview))
        .route("/config", get(config))
        .route("/jobs", get(jobs))
        .route("/jobs/overview", get(jobs_overview))
        .route("/jobs/{jobid}", get(job).patch(cancel))
        .route(
            "/jobs/{jobid}/checkpoints",
            get(checkpoints).post(trigger_checkpoint),
        )
        .route(
            "/jobs/{jobid}/checkpoints/config",
            get(checkpoint_config).patch(retune),
        )
        .route(
            "/jobs/{jobid}/checkpoints/details/{cid}",
            get(checkpoint_details),
        )
        .route(
            "/jobs/{jobid}/checkpoints/details/{cid}/subtasks/{vertexid}",
            get(checkpoint_subtasks),
        )
        .route(
            "/jobs/{jobid}/checkpoints/{triggerid}",
            get(checkpoint_operation),
        )
        .route(
            "/jobs/{jobid}/savepoints",
            axum::routing::post(trigger_savepoint),
        )
        .route(
            "/jobs/{jobid}/savepoints/{triggerid}",
            get(savepoint_operation),
        )
        .route("/jobs/{jobid}/stop", axum::routing::post(stop))
        .route(
            "/jobs/{jobid}/vertices/{vertexid}/backpressure",
            get(backpressure),
        )
        .route("/metrics", get(metrics_text))
        .merge(web::routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(shared)
}

/// Every error answer as JSON `{"errors": [..]}`, including the ones axum makes itself (a body
/// over the limit, a path that does not decode, a method a path does not take).
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let allow = response.headers().get(axum::http::header::ALLOW).cloned();
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_string();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut answer = error(status, message);
    if let Some(allow) = allow {
        answer
            .headers_mut()
            .insert(axum::http::header::ALLOW, allow);
    }
    answer
}

async fn not_found(uri: Uri) -> Response {
    error(StatusCode::NOT_FOUND, format!("Not found: {}", uri.path()))
}

/// The job's view if `jobid` is its id.
fn the_job(shared: &Shared, jobid: &str) -> Result<crate::job::JobView, ApiError> {
    let view = shared.client.view();
    if view.job_id == jobid {
        Ok(view)
    } else {
        Err(fail(
            StatusCode::NOT_FOUND,
            format!("Job {jobid} not found"),
        ))
    }
}

async fn overview(State(s): State<AppState>) -> Response {
    ok(views::overview(&s.client.view()))
}

async fn config(State(s): State<AppState>) -> Response {
    ok(json!({
        "refresh-interval": 3000,
        "timezone-name": "UTC",
        "timezone-offset": 0,
        "flink-version": concat!("weir ", env!("CARGO_PKG_VERSION")),
        "flink-revision": "",
        "features": {"web-submit": false, "web-cancel": !s.read_only, "web-history": false},
    }))
}

/// `GET /jobs`: this job, and in cluster mode the jobs that ran on the cluster before it.
async fn jobs(State(s): State<AppState>) -> Response {
    let v = s.client.view();
    let mut jobs = vec![json!({"id": v.job_id, "status": v.state})];
    jobs.extend(views::past_jobs(&v).map(|p| json!({"id": p.id, "status": p.state})));
    ok(json!({ "jobs": jobs }))
}

async fn jobs_overview(State(s): State<AppState>) -> Response {
    let v = s.client.view();
    let mut job = views::job(&v, &vertex_figures(&s), now_ms());
    if let Some(o) = job.as_object_mut() {
        o.remove("vertices");
        o.remove("plan");
        o.insert("last-modification".into(), json!(now_ms()));
    }
    let mut jobs = vec![job];
    jobs.extend(views::past_jobs(&v).map(views::past_job));
    ok(json!({ "jobs": jobs }))
}

/// `GET /jobs/:jobid`: this job in full; a job that ran on the cluster before it as its task
/// managers remember it (id, name, state, times: its details are in no process now).
async fn job(State(s): State<AppState>, Path(jobid): Path<String>) -> Response {
    match the_job(&s, &jobid) {
        Ok(v) => ok(views::job(&v, &vertex_figures(&s), now_ms())),
        Err(e) => {
            let v = s.client.view();
            match views::past_jobs(&v).find(|p| p.id == jobid) {
                Some(p) => ok(views::past_job(p)),
                None => e.into_response(),
            }
        }
    }
}

async fn checkpoints(State(s): State<AppState>, Path(jobid): Path<String>) -> Response {
    match the_job(&s, &jobid) {
        Ok(v) => ok(views::checkpoints(&s.client.checkpoint_stats(), &v)),
        Err(e) => e.into_response(),
    }
}

async fn checkpoint_config(State(s): State<AppState>, Path(jobid): Path<String>) -> Response {
    match the_job(&s, &jobid) {
        Ok(v) => ok(views::checkpoint_config(&v)),
        Err(e) => e.into_response(),
    }
}

fn parse_id(text: &str, what: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("{what} '{text}' is not a number"),
        )
    })
}

async fn checkpoint_details(
    State(s): State<AppState>,
    Path((jobid, cid)): Path<(String, String)>,
) -> Response {
    let found = the_job(&s, &jobid).and_then(|v| {
        let id = parse_id(&cid, "checkpoint id")?;
        let stats = s.client.checkpoint_stats();
        let c = stats.iter().find(|c| c.id.0 == id).ok_or_else(|| {
            fail(
                StatusCode::NOT_FOUND,
                format!("Checkpoint {id} not found (the history keeps the last few)"),
            )
        })?;
        Ok(views::checkpoint(c, &v))
    });
    found.map_or_else(IntoResponse::into_response, ok)
}

async fn checkpoint_subtasks(
    State(s): State<AppState>,
    Path((jobid, cid, vertexid)): Path<(String, String, String)>,
) -> Response {
    let found = the_job(&s, &jobid).and_then(|v| {
        let id = parse_id(&cid, "checkpoint id")?;
        let (vertex, parallelism) = v
            .vertices
            .iter()
            .find(|(vid, _, _)| views::vertex_id(*vid) == vertexid)
            .map(|(vid, _, p)| (*vid, *p))
            .ok_or_else(|| {
                fail(
                    StatusCode::NOT_FOUND,
                    format!("Vertex {vertexid} not found"),
                )
            })?;
        let stats = s.client.checkpoint_stats();
        let c = stats
            .iter()
            .find(|c| c.id.0 == id)
            .ok_or_else(|| fail(StatusCode::NOT_FOUND, format!("Checkpoint {id} not found")))?;
        Ok(views::subtasks(c, vertex, parallelism))
    });
    found.map_or_else(IntoResponse::into_response, ok)
}

/// `GET /jobs/:jobid/vertices/:vertexid/backpressure`: each subtask's share of the last
/// seconds it waited for credits, and Flink's level of it.
async fn backpressure(
    State(s): State<AppState>,
    Path((jobid, vertexid)): Path<(String, String)>,
) -> Response {
    let found = the_job(&s, &jobid).and_then(|v| {
        let vertex = v
            .vertices
            .iter()
            .find(|(vid, _, _)| views::vertex_id(*vid) == vertexid)
            .map(|(vid, _, _)| *vid)
            .ok_or_else(|| {
                fail(
                    StatusCode::NOT_FOUND,
                    format!("Vertex {vertexid} not found"),
                )
            })?;
        let figures = vertex_figures(&s);
        let rate = figures
            .get(&vertex)
            .map(|(_, r)| r.clone())
            .unwrap_or_default();
        Ok(views::backpressure(&rate, now_ms()))
    });
    found.map_or_else(IntoResponse::into_response, ok)
}

/// Parses an optional JSON object body.
fn body_object(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(fail(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        )),
        Err(e) => Err(fail(
            StatusCode::BAD_REQUEST,
            format!("the request body is not JSON: {e}"),
        )),
    }
}

fn mutation_allowed(s: &Shared, jobid: &str) -> Result<(), ApiError> {
    if s.read_only {
        return Err(fail(
            StatusCode::FORBIDDEN,
            "this REST API is read-only (--rest-read-only)",
        ));
    }
    the_job(s, jobid).map(|_| ())
}

/// Starts `run` as an asynchronous operation of `kind`; its trigger id.
fn start_operation<F>(s: &AppState, kind: Kind, run: F) -> Response
where
    F: std::future::Future<Output = Result<String, JobError>> + Send + 'static,
{
    let id = s.operations.begin(kind);
    let (shared, key) = (s.clone(), id.clone());
    tokio::spawn(async move {
        let result = run.await;
        shared.operations.end(&key, result);
    });
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({ "request-id": id })),
    )
        .into_response()
}

fn operation(s: &Shared, kind: Kind, jobid: &str, triggerid: &str) -> Response {
    if let Err(e) = the_job(s, jobid) {
        return e.into_response();
    }
    match s.operations.get(kind, triggerid) {
        None => error(
            StatusCode::NOT_FOUND,
            format!("Operation {triggerid} not found"),
        ),
        Some(Operation::InProgress) => ok(json!({"status": {"id": "IN_PROGRESS"}})),
        Some(Operation::Completed(location)) => ok(json!({
            "status": {"id": "COMPLETED"},
            "operation": {"location": location},
        })),
        Some(Operation::Failed(cause)) => ok(json!({
            "status": {"id": "COMPLETED"},
            "operation": {"failure-cause": {"class": "SnapshotFailed", "stack-trace": cause}},
        })),
    }
}

async fn checkpoint_operation(
    State(s): State<AppState>,
    Path((jobid, triggerid)): Path<(String, String)>,
) -> Response {
    operation(&s, Kind::Checkpoint, &jobid, &triggerid)
}

async fn savepoint_operation(
    State(s): State<AppState>,
    Path((jobid, triggerid)): Path<(String, String)>,
) -> Response {
    operation(&s, Kind::Savepoint, &jobid, &triggerid)
}

async fn trigger_checkpoint(
    State(s): State<AppState>,
    Path(jobid): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = mutation_allowed(&s, &jobid).and_then(|()| body_object(&body).map(|_| ())) {
        return e.into_response();
    }
    let client = s.client.clone();
    start_operation(&s, Kind::Checkpoint, async move {
        retrying(|| client.trigger_checkpoint()).await
    })
}

/// A string field of a request body, if present.
fn string_field(
    o: &serde_json::Map<String, Value>,
    names: &[&str],
) -> Result<Option<String>, ApiError> {
    for name in names {
        match o.get(*name) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.trim().is_empty() => {
                return Err(fail(
                    StatusCode::BAD_REQUEST,
                    format!("'{name}' must not be empty"),
                ));
            }
            Some(Value::String(s)) => return Ok(Some(s.clone())),
            Some(_) => {
                return Err(fail(
                    StatusCode::BAD_REQUEST,
                    format!("'{name}' must be a string"),
                ));
            }
        }
    }
    Ok(None)
}

fn bool_field(o: &serde_json::Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(fail(
            StatusCode::BAD_REQUEST,
            format!("'{name}' must be true or false"),
        )),
    }
}

async fn trigger_savepoint(
    State(s): State<AppState>,
    Path(jobid): Path<String>,
    body: Bytes,
) -> Response {
    let parsed = mutation_allowed(&s, &jobid).and_then(|()| {
        let o = body_object(&body)?;
        let dir = string_field(&o, &["target-directory", "targetDirectory"])?;
        let cancel = bool_field(&o, "cancel-job")?;
        Ok((dir, cancel))
    });
    let (dir, cancel) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let client = s.client.clone();
    start_operation(&s, Kind::Savepoint, async move {
        let dir: Option<std::path::PathBuf> = dir.map(Into::into);
        let path = retrying(|| client.trigger_savepoint(dir.clone())).await?;
        if cancel {
            client.cancel();
        }
        Ok(path)
    })
}

async fn stop(State(s): State<AppState>, Path(jobid): Path<String>, body: Bytes) -> Response {
    let parsed = mutation_allowed(&s, &jobid).and_then(|()| {
        let o = body_object(&body)?;
        let dir = string_field(&o, &["targetDirectory", "target-directory"])?;
        Ok((dir, bool_field(&o, "drain")?))
    });
    let (dir, drain) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let client = s.client.clone();
    start_operation(&s, Kind::Savepoint, async move {
        let dir: Option<std::path::PathBuf> = dir.map(Into::into);
        retrying(|| client.stop_with_savepoint(dir.clone(), drain)).await
    })
}

async fn cancel(
    State(s): State<AppState>,
    Path(jobid): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = mutation_allowed(&s, &jobid) {
        return e.into_response();
    }
    match q.get("mode").map(String::as_str) {
        None | Some("cancel") => {
            s.client.cancel();
            (StatusCode::ACCEPTED, axum::Json(json!({}))).into_response()
        }
        Some(other) => error(
            StatusCode::BAD_REQUEST,
            format!("mode '{other}' is not supported: only mode=cancel"),
        ),
    }
}

/// The tuning a `PATCH …/checkpoints/config` body asks for: durations in ms.
fn tuning_of(o: &serde_json::Map<String, Value>) -> Result<CheckpointTuning, ApiError> {
    const FIELDS: [&str; 4] = [
        "interval",
        "timeout",
        "min_pause",
        "tolerable_failed_checkpoints",
    ];
    if let Some(unknown) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            format!("'{unknown}' cannot be changed: only {}", FIELDS.join(", ")),
        ));
    }
    let number = |name: &str| -> Result<Option<u64>, ApiError> {
        match o.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                fail(
                    StatusCode::BAD_REQUEST,
                    format!("'{name}' must be a whole number of ms (or failures), not {v}"),
                )
            }),
        }
    };
    let ms = |n: Option<u64>| n.map(std::time::Duration::from_millis);
    let tuning = CheckpointTuning {
        interval: ms(number("interval")?),
        timeout: ms(number("timeout")?),
        min_pause: ms(number("min_pause")?),
        tolerable_failed_checkpoints: number("tolerable_failed_checkpoints")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    };
    if tuning.is_empty() {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            format!("nothing to change: give one of {}", FIELDS.join(", ")),
        ));
    }
    Ok(tuning)
}

/// `PATCH /jobs/:jobid/checkpoints/config`: live tuning of the running job's checkpointing.
async fn retune(State(s): State<AppState>, Path(jobid): Path<String>, body: Bytes) -> Response {
    let tuning = match mutation_allowed(&s, &jobid).and_then(|()| tuning_of(&body_object(&body)?)) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    match s.client.retune_checkpoints(tuning).await {
        Ok(_) => ok(views::checkpoint_config(&s.client.view())),
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

async fn metrics_text(State(s): State<AppState>) -> Response {
    let text = metrics::render(
        &s.client.view(),
        &s.client.checkpoint_stats(),
        &vertex_figures(&s),
        now_ms(),
    );
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

//! The web UI: one page and its script and style, embedded in the binary (no CDN, no build
//! step), served by the REST server at `/`. The page reads the REST API, as Flink's web UI
//! does: the job graph, the checkpoint timeline and details, the configuration, and buttons
//! for a checkpoint, a savepoint and a cancel.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX: &str = include_str!("web/index.html");
const SCRIPT: &str = include_str!("web/app.js");
const STYLE: &str = include_str!("web/style.css");

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            // The page runs only its own script and talks only to this server.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                 script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
            ),
        ],
        body,
    )
}

/// The page's routes: `/` (and `/index.html`), `/web/app.js`, `/web/style.css`.
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/index.html",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/web/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/web/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

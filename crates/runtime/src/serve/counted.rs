//! Every response a server gives, counted by status (`streamgate_server_responses_total`,
//! labels `server` and `status`): the HTTP status, or for gRPC the code of an immediate
//! answer (`grpc-status` in the headers: refusals, bad requests). A gRPC stream's closing
//! code travels in its trailers, after this layer has seen the response, so a successful
//! or streamed call counts as `200`.

use axum::response::Response;

/// `router` with its HTTP responses counted.
pub(crate) fn http(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::map_response(count_http))
}

/// `router` (gRPC services as an axum router) with its responses counted.
pub(crate) fn grpc(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::map_response(count_grpc))
}

async fn count_http(res: Response) -> Response {
    record("http", res.status().as_str().to_owned());
    res
}

async fn count_grpc(res: Response) -> Response {
    let status = match res.headers().get("grpc-status") {
        Some(code) => format!("{:?}", tonic::Code::from_bytes(code.as_bytes())),
        None => res.status().as_str().to_owned(),
    };
    record("grpc", status);
    res
}

fn record(server: &'static str, status: String) {
    metrics::counter!("streamgate_server_responses_total", "server" => server, "status" => status)
        .increment(1);
}

//! `GET /v1/runs?tenant=&status=open|ended|all&after=<cursor>&limit=`: the channel's
//! runs this replica knows — in flight on its partitions, and ended here recently (the
//! channel's bounded memory of ended runs) — ordered by (tenant, run id) and paged by a
//! cursor: `next` names the last row of a full page, `after=<next>` gives the next page.
//! Every replica of a channel answers for its own partitions; the run stream itself
//! works for any run on any replica.

use super::RunStreamState;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// Rows of one page by default, and at most.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    tenant: Option<String>,
    #[serde(default)]
    status: Status,
    after: Option<String>,
    limit: Option<usize>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Open,
    Ended,
    #[default]
    All,
}

/// One run of the list.
#[derive(Debug, Serialize)]
struct Row {
    tenant: String,
    run_id: String,
    status: Status,
    chat_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_key: Option<String>,
    /// Highest seq rendered (open runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seq: Option<u64>,
    /// When it ended (ended runs), ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at_ms: Option<u64>,
}

/// The cursor of a row: `<tenant>/<run id>`, each part with `%` and `/` percent-encoded
/// (ids may hold `/`, so the separator must not occur inside a part).
fn cursor(r: &Row) -> String {
    format!("{}/{}", encode(&r.tenant), encode(&r.run_id))
}

fn encode(part: &str) -> String {
    part.replace('%', "%25").replace('/', "%2F")
}

fn decode(part: &str) -> String {
    part.replace("%2F", "/")
        .replace("%2f", "/")
        .replace("%25", "%")
}

/// The (tenant, run id) a cursor names.
fn parse_cursor(c: &str) -> Option<(String, String)> {
    let (t, r) = c.split_once('/')?;
    Some((decode(t), decode(r)))
}

pub(super) async fn list(State(s): State<RunStreamState>, Query(q): Query<ListQuery>) -> Response {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let after = match q.after.as_deref().map(parse_cursor) {
        None => None,
        Some(Some(pair)) => Some(pair),
        Some(None) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({"error": "after must be a cursor `<tenant>/<run id>` from `next`"})),
            )
                .into_response()
        }
    };
    let mut rows: Vec<Row> = Vec::new();
    if q.status != Status::Ended {
        rows.extend(s.channel.active_runs().into_iter().map(|r| Row {
            tenant: r.tenant,
            run_id: r.run_id,
            status: Status::Open,
            chat_id: r.chat_id,
            session_key: r.session_key,
            last_seq: Some(r.last_seq),
            ended_at_ms: None,
        }));
    }
    if q.status != Status::Open {
        rows.extend(
            s.channel
                .ended_runs()
                .into_iter()
                .map(|((tenant, run_id), e)| Row {
                    tenant,
                    run_id,
                    status: Status::Ended,
                    chat_id: e.chat_id,
                    session_key: None,
                    last_seq: None,
                    ended_at_ms: u64::try_from(streamgate_runtime::clock::ms_of(e.ended_at)).ok(),
                }),
        );
    }
    rows.retain(|r| q.tenant.as_ref().is_none_or(|t| *t == r.tenant));
    rows.sort_by(|a, b| (&a.tenant, &a.run_id).cmp(&(&b.tenant, &b.run_id)));
    // A run that just ended may be in both lists for a moment: keep one row.
    rows.dedup_by(|a, b| a.tenant == b.tenant && a.run_id == b.run_id);
    if let Some((t, r)) = &after {
        rows.retain(|row| (&row.tenant, &row.run_id) > (t, r));
    }
    let next = (rows.len() > limit).then(|| cursor(&rows[limit - 1]));
    rows.truncate(limit);
    Json(serde_json::json!({ "runs": rows, "next": next })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_ids_with_slashes_and_percents() {
        for (t, r) in [("acme", "r1"), ("a/b", "c/d"), ("50%", "%2F/x"), ("t", "")] {
            let row = Row {
                tenant: t.into(),
                run_id: r.into(),
                status: Status::Open,
                chat_id: String::new(),
                session_key: None,
                last_seq: None,
                ended_at_ms: None,
            };
            assert_eq!(
                parse_cursor(&cursor(&row)),
                Some((t.to_owned(), r.to_owned()))
            );
        }
    }
}

//! Archive records and run folds → protobuf replies.

use streamgate_archive::{ArchivedEvent, RawChunkRecord, RunRecord};
use streamgate_grammar::fold::RunProgress;
use streamgate_grammar::{RunState, TimelineEntry};
use streamgate_proto::v1;

/// A run row as a reply.
pub fn run(r: &RunRecord) -> v1::Run {
    v1::Run {
        tenant: r.tenant.clone(),
        run_id: r.run_id.clone(),
        session_key: r.session_key.clone(),
        provider: r.provider.clone(),
        model: r.model.clone(),
        status: r.status.as_str().to_owned(),
        stop_reason: r.stop_reason.clone(),
        usage_json: r.usage.as_ref().map(|u| u.get().to_owned()),
        first_seq: r.first_seq,
        last_seq: r.last_seq,
        first_ts_ms: r.first_ts_ms,
        last_ts_ms: r.last_ts_ms,
        event_count: r.event_count,
        adapter: r.provenance.as_ref().map(|p| p.adapter.clone()),
        adapter_version: r.provenance.as_ref().map(|p| p.adapter_version),
        grammar_version: r.provenance.as_ref().map(|p| p.grammar_version),
        generation: r.generation,
        snippet: None,
        input_tokens: r.tokens.map(|t| t.input),
        output_tokens: r.tokens.map(|t| t.output),
        reasoning_tokens: r.tokens.map(|t| t.reasoning),
        cache_read_tokens: r.tokens.map(|t| t.cache_read),
        cache_write_tokens: r.tokens.map(|t| t.cache_write),
        ttft_ms: r.first_token_ts_ms.map(|t| t - r.first_ts_ms),
        ttfa_ms: r.first_answer_ts_ms.map(|t| t - r.first_ts_ms),
        duration_ms: r.last_ts_ms - r.first_ts_ms,
        cost: None,
    }
}

/// An archived event as a reply.
pub fn event(e: &ArchivedEvent) -> v1::ArchivedEvent {
    v1::ArchivedEvent {
        event: Some(v1::Event::from(&e.event)),
        journal_seq: e.journal_seq,
    }
}

/// A raw chunk from SG_RAW as an archive record.
pub fn raw_record(c: streamgate_bus::raw::RawChunk) -> RawChunkRecord {
    RawChunkRecord {
        tenant: c.addr.tenant.into(),
        run_id: c.addr.run_id.into(),
        chunk: c.chunk,
        family: c.family,
        ingest_ts_ms: c.ingest_ts_ms,
        close: c.close.map(|k| k.as_str().to_owned()),
        body: c.body.to_vec(),
    }
}

/// A raw chunk as a reply.
pub fn raw(c: RawChunkRecord) -> v1::RawChunk {
    v1::RawChunk {
        chunk: c.chunk,
        family: c.family,
        ingest_ts_ms: c.ingest_ts_ms,
        close: c.close,
        body: c.body,
    }
}

/// A folded run state of the run `(tenant, run_id)` as a reply.
pub fn state(tenant: &str, run_id: &str, s: &RunState) -> v1::RunState {
    let (status, stop_reason) = match &s.progress {
        RunProgress::Open => ("open", None),
        RunProgress::Ended { reason, .. } => {
            ("ended", reason.as_ref().map(|r| r.as_str().to_owned()))
        }
        RunProgress::Failed { reason, .. } => {
            ("failed", reason.as_ref().map(|r| r.as_str().to_owned()))
        }
    };
    v1::RunState {
        run_id: run_id.to_owned(),
        at_seq: s.last_seq,
        provider: s.provider.clone(),
        model: s.model.clone(),
        status: status.to_owned(),
        stop_reason,
        final_text: s.final_text.clone(),
        final_truncated: s.final_truncated,
        thinking: s
            .thinking
            .iter()
            .map(|t| v1::ThinkingSegment {
                id: t.id.clone(),
                variant: t.variant.as_str().to_owned(),
                text: t.text.clone(),
                tokens: t.tokens,
                first_seq: t.first_seq,
                last_seq: t.last_seq,
                closed: t.closed,
            })
            .collect(),
        commentary: s
            .commentary
            .iter()
            .map(|c| v1::TextSegment {
                id: c.id.clone(),
                text: c.text.clone(),
                first_seq: c.first_seq,
                last_seq: c.last_seq,
            })
            .collect(),
        items: s
            .items
            .iter()
            .map(|i| v1::ToolItem {
                id: i.id.clone(),
                index: i.index,
                kind: i.kind.clone(),
                name: i.name.clone(),
                status: i.status.clone(),
                input_json: i.input.as_ref().map(|j| j.get().to_owned()),
                input_text: i.input_text.clone(),
                arguments_json: i.arguments.as_ref().map(|j| j.get().to_owned()),
                result_json: i.result.as_ref().map(|j| j.get().to_owned()),
                output_text: i.output_text.clone(),
                first_seq: i.first_seq,
                last_seq: i.last_seq,
                ended: i.ended,
            })
            .collect(),
        usage_json: s.usage.as_ref().map(|u| u.get().to_owned()),
        tenant: tenant.to_owned(),
    }
}

/// The timeline of the run `(tenant, run_id)` as a reply.
pub fn timeline(tenant: &str, run_id: &str, entries: &[TimelineEntry]) -> v1::Timeline {
    v1::Timeline {
        tenant: tenant.to_owned(),
        run_id: run_id.to_owned(),
        entries: entries
            .iter()
            .map(|e| v1::TimelineEntry {
                kind: e.kind.as_str().to_owned(),
                id: e.id.clone(),
                label: e.label.clone(),
                start_seq: e.start_seq,
                end_seq: e.end_seq,
                start_ts_ms: e.start_ts_ms,
                end_ts_ms: e.end_ts_ms,
                duration_ms: e.duration_ms(),
            })
            .collect(),
    }
}

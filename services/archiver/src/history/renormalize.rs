//! One run's archived raw chunks through today's adapter, exactly as the normalizer's run
//! table feeds them live (`streamgate_normalizer::runs`): one [`Normalizer`] chosen by the
//! first chunk's family header (`auto` and unknown names detect), each chunk's body fed
//! in chunk order, the close marker's kind closing it, each event enveloped with its
//! chunk's ingest time and cut to the broker's message size.

use streamgate_archive::{ArchiveError, Provenance, RawChunkRecord, Store};
use streamgate_grammar::{Envelope, RunEvent};
use streamgate_wire::{Close, FamilyChoice, Normalizer};

/// Raw chunks read per page.
const RAW_PAGE: u32 = 256;

/// A run being re-normalized, page by page.
pub struct Renormalizer<'s> {
    store: &'s dyn Store,
    tenant: String,
    run_id: String,
    session_key: Option<String>,
    max_payload: usize,
    normalizer: Option<Normalizer>,
    family_header: Option<String>,
    next_chunk: u64,
    done: bool,
    closed: bool,
    /// Raw bytes fed so far.
    pub raw_bytes: u64,
}

impl<'s> Renormalizer<'s> {
    /// Starts re-normalizing the run; `max_payload` is the broker's message limit the
    /// live events were cut to.
    pub fn new(
        store: &'s dyn Store,
        tenant: &str,
        run_id: &str,
        session_key: Option<String>,
        max_payload: usize,
    ) -> Renormalizer<'s> {
        Renormalizer {
            store,
            tenant: tenant.to_owned(),
            run_id: run_id.to_owned(),
            session_key,
            max_payload,
            normalizer: None,
            family_header: None,
            next_chunk: 0,
            done: false,
            closed: false,
            raw_bytes: 0,
        }
    }

    /// The events of the next page of raw chunks, in seq order; `None` once the run's
    /// raw chunks are exhausted. A hole in the chunk indexes ends the run there, as it
    /// does live (the normalizer cannot apply a chunk before the missing one).
    pub async fn next_page(&mut self) -> Result<Option<Vec<RunEvent>>, ArchiveError> {
        if self.done {
            return Ok(None);
        }
        let chunks = self
            .store
            .raw_chunks_from(&self.tenant, &self.run_id, self.next_chunk, RAW_PAGE)
            .await?;
        if chunks.len() < RAW_PAGE as usize {
            self.done = true;
        }
        let mut out = Vec::new();
        for chunk in &chunks {
            if chunk.chunk != self.next_chunk {
                self.done = true;
                break;
            }
            self.next_chunk += 1;
            self.feed(chunk, &mut out);
            if chunk.close.is_some() {
                self.done = true;
                self.closed = true;
                break;
            }
        }
        if out.is_empty() && self.done && chunks.is_empty() {
            return Ok(None);
        }
        Ok(Some(out))
    }

    fn feed(&mut self, chunk: &RawChunkRecord, out: &mut Vec<RunEvent>) {
        let normalizer = self.normalizer.get_or_insert_with(|| {
            Normalizer::new(chunk.family.parse().unwrap_or(FamilyChoice::Auto))
        });
        self.family_header
            .get_or_insert_with(|| chunk.family.clone());
        self.raw_bytes += chunk.body.len() as u64;
        normalizer.feed(&chunk.body);
        if let Some(close) = chunk.close.as_deref().and_then(Close::parse) {
            normalizer.close(close);
        }
        drop(normalizer.take_transcript());
        let envelope = Envelope {
            tenant: self.tenant.clone(),
            session_key: self.session_key.clone(),
            run_id: self.run_id.clone(),
            ts_ms: chunk.ingest_ts_ms,
        };
        let start = out.len();
        out.extend(normalizer.drain().map(|event| RunEvent {
            envelope: envelope.clone(),
            event,
        }));
        streamgate_wire::oversize::fit(&mut out[start..], self.max_payload);
    }

    /// Whether the raw chunks end with a close marker: the run's input is complete.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Whether any raw chunk was found.
    pub fn saw_raw(&self) -> bool {
        self.family_header.is_some()
    }

    /// The family header of the run's first raw chunk.
    pub fn family_header(&self) -> Option<&str> {
        self.family_header.as_deref()
    }

    /// What makes the run's events today: the adapter the first chunk selected (as
    /// detected, for `auto`), its version and the grammar's.
    pub fn made_today(&self) -> Option<Provenance> {
        let family = self.normalizer.as_ref()?.family()?;
        Some(Provenance {
            adapter: family.as_str().to_owned(),
            adapter_version: family.adapter_version(),
            grammar_version: streamgate_grammar::GRAMMAR_VERSION,
        })
    }
}

//! Op builders for tests.

use crate::delivery::{Delivery, DeliveryConfig, MemoryStore};
use crate::sink::Sink;
use std::sync::Arc;
use std::time::Duration;
use streamgate_projection::{DraftKey, Op};

pub(crate) fn key(run: &str) -> DraftKey {
    DraftKey {
        run_id: run.to_owned(),
        tenant: String::new(),
    }
}

pub(crate) fn draft(run: &str, text: &str, seq: u64) -> Op {
    Op::Draft {
        key: key(run),
        text: text.to_owned(),
        seq,
        live: None,
    }
}

pub(crate) fn settle(run: &str, text: &str, seq: u64) -> Op {
    Op::Settle {
        key: key(run),
        text: text.to_owned(),
        seq,
    }
}

pub(crate) fn final_op(run: &str, text: &str, seq: u64) -> Op {
    Op::Final {
        key: key(run),
        text: text.to_owned(),
        truncated: false,
        suffix: None,
        seq,
    }
}

/// An engine fast enough for real-time HTTP tests: 429 pauses still apply.
pub(crate) fn fast_engine(sink: Arc<dyn Sink>) -> (Delivery, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let config = DeliveryConfig {
        chat_rate: Some(crate::sink::Rate::new(100.0, 10)),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        attempt_timeout: Duration::from_secs(5),
        ..DeliveryConfig::default()
    };
    (Delivery::new(config, store.clone(), [sink]), store)
}

//! Routing fields around an event (docs/architecture.md §2): who the run belongs to and when its
//! bytes arrived. The event itself stays the golden shape; the envelope travels beside it.

use crate::event::Event;
use serde::{Deserialize, Serialize};

/// Where an event belongs: tenant, session and run, plus the ingest time of the raw chunk
/// that produced it (carried in the raw message, so replays are deterministic). An event's
/// id is built in one place, `streamgate_bus::events::event_msg_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Tenant that owns the run.
    pub tenant: String,
    /// Optional chat session the run belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The run (one provider turn).
    pub run_id: String,
    /// Ingest time of the raw chunk, milliseconds since the Unix epoch.
    pub ts_ms: i64,
}

/// An event with its envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// Routing fields.
    pub envelope: Envelope,
    /// The canonical event.
    pub event: Event,
}

impl RunEvent {
    /// The golden shape plus envelope fields, as one JSON line.
    pub fn to_json(&self) -> String {
        let mut line = self.event.to_json();
        // The golden line is an object; splice the envelope members in before its end.
        line.pop();
        let env = serde_json::to_string(&self.envelope).unwrap_or_else(|_| "{}".into());
        line.push(',');
        line.push_str(&env[1..]);
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventData, Lifecycle, LifecyclePhase};

    #[test]
    fn json_has_golden_and_envelope_fields() {
        let ev = RunEvent {
            envelope: Envelope {
                tenant: "t".into(),
                session_key: None,
                run_id: "r1".into(),
                ts_ms: 5,
            },
            event: Event {
                seq: 1,
                data: EventData::from(Lifecycle::new(LifecyclePhase::Start)),
            },
        };
        let v: serde_json::Value = serde_json::from_str(&ev.to_json()).unwrap();
        assert_eq!(v["seq"], 1);
        assert_eq!(v["stream"], "lifecycle");
        assert_eq!(v["run_id"], "r1");
        assert_eq!(v["ts_ms"], 5);
    }
}

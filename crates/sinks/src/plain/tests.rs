use super::PlainSink;
use crate::{ChatTarget, DeliveryState, Sink};
use streamgate_projection::{DraftKey, Op};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn writes_final_once_and_skips_drafts() {
    let (w, mut r) = tokio::io::duplex(4096);
    let sink = PlainSink::new("term", w);
    let chat = ChatTarget::new("", "term", "");
    let key = DraftKey {
        run_id: "r1".into(),
        tenant: String::new(),
    };
    let mut st = DeliveryState::default();
    let draft = Op::Draft {
        key: key.clone(),
        text: "working".into(),
        seq: 1,
        live: None,
    };
    let fin = Op::Final {
        key: key.clone(),
        text: "the answer".into(),
        truncated: true,
        suffix: Some("⚠️ truncated (token limit)".into()),
        seq: 9,
    };
    let notice = Op::Notice {
        key,
        text: "error: x".into(),
        seq: 10,
    };
    for op in [&draft, &fin, &fin, &notice, &notice] {
        assert!(sink.execute(&chat, op, &mut st).await.is_ok());
    }
    drop(sink);
    let mut out = String::new();
    assert!(r.read_to_string(&mut out).await.is_ok());
    assert_eq!(out, "the answer\n⚠️ truncated (token limit)\nerror: x\n");
    assert!(st.final_delivered);
}

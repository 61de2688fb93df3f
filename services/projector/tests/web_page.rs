//! The web channel's page, as a person's browser shows it (headless Chromium over the
//! DevTools protocol) and as its server answers: the page is a client of the run stream
//! (issue #19). A binary of its own: the browser's load stays out of the delivery tests'
//! timing.
#![allow(missing_docs)]

#[path = "projector/cdp.rs"]
mod cdp;
#[path = "projector/common.rs"]
mod common;

use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use streamgate_grammar::RunEvent;
use streamgate_projector::start;
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

/// A broker with the streams, and a web channel on it: the page's address.
async fn web_page() -> Result<
    (
        NatsServer,
        async_nats::jetstream::Context,
        streamgate_projector::Running,
        std::net::SocketAddr,
    ),
    Box<dyn std::error::Error>,
> {
    let (nats, js) = NatsServer::with_streams().await;
    let running = start(
        nats.client().await,
        web_channel(),
        None,
        CancellationToken::new(),
    )
    .await?;
    let web = running.web.ok_or("no web listener")?;
    Ok((nats, js, running, web))
}

/// The page's server side without a browser: the run list as JSON and pushed over SSE
/// (live, then ended), markdown rendered and sanitized by `POST /api/render`, the page's
/// files served from `/assets/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_page_pushes_the_run_list_and_renders_markdown_on_the_server() -> R {
    let (_nats, js, _running, web) = web_page().await?;
    let events = canonical(TOOL_LOOP)?;
    let evs = run_events("run-web", "chat-web", &events, now_ms());
    let http = reqwest::Client::new();
    let mut list = http
        .get(format!("http://{web}/api/runs/events"))
        .send()
        .await?;
    assert_eq!(
        list.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    publish(&js, &evs[..7]).await?;
    let mut body = String::new();
    let pushed = |body: &str, status: &str| {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .any(|v| v[0]["run_id"] == "run-web" && v[0]["status"] == status)
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut live_seen = false;
    while Instant::now() < deadline {
        if !live_seen && pushed(&body, "live") {
            live_seen = true;
            publish(&js, &evs[7..]).await?;
        }
        if live_seen && pushed(&body, "completed") {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(5), list.chunk()).await {
            Ok(Ok(Some(c))) => body.push_str(&String::from_utf8_lossy(&c)),
            _ => break,
        }
    }
    assert!(live_seen, "the live run was never pushed: {body}");
    assert!(
        pushed(&body, "completed"),
        "the ended run was never pushed: {body}"
    );
    let rows: serde_json::Value = http
        .get(format!("http://{web}/api/runs"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(rows[0]["tenant"], TENANT, "{rows}");
    assert_eq!(rows[0]["preview"], "Line counts", "{rows}");

    let html = http
        .post(format!("http://{web}/api/render"))
        .body("## Hi\n\n<script>alert(1)</script>\n\n```rust\nfn main() {}\n```")
        .send()
        .await?
        .text()
        .await?;
    assert!(html.contains("<h2>Hi</h2>"), "{html}");
    assert!(!html.contains("<script"), "{html}");
    assert!(html.contains("<pre data-lang=\"rust\">"), "{html}");
    for (file, kind) in [
        ("app.js", "text/javascript"),
        ("fold.js", "text/javascript"),
        ("highlight.min.js", "text/javascript"),
        ("app.css", "text/css"),
        ("highlight.css", "text/css"),
    ] {
        let r = http
            .get(format!("http://{web}/assets/{file}"))
            .send()
            .await?;
        assert_eq!(r.status(), 200, "{file}");
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(ct.starts_with(kind), "{file}: {ct}");
    }
    let missing = http
        .get(format!("http://{web}/assets/nope.js"))
        .send()
        .await?;
    assert_eq!(missing.status(), 404);
    Ok(())
}

/// After the projector restarts, the page still lists the runs `SG_EVENTS` holds (read
/// once at start, last event per run), with their status, and the run stream still
/// serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_run_list_survives_a_projector_restart() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let events = canonical(TOOL_LOOP)?;
    let stop = CancellationToken::new();
    let running = start(nats.client().await, web_channel(), None, stop.clone()).await?;
    publish(
        &js,
        &run_events("run-before", "chat-1", &events, now_ms() - 5_000),
    )
    .await?;
    assert!(
        poll_until(Duration::from_secs(15), || running
            .channel
            .ended_runs()
            .iter()
            .any(|((_, r), _)| r == "run-before"))
        .await,
        "the run never ended on the first projector"
    );
    stop.cancel();
    let mut tasks = running.tasks;
    while tasks.join_next().await.is_some() {}

    let running = start(
        nats.client().await,
        web_channel(),
        None,
        CancellationToken::new(),
    )
    .await?;
    let web = running.web.ok_or("no web listener")?;
    let http = reqwest::Client::new();
    let t = Instant::now();
    let rows = loop {
        let rows: serde_json::Value = http
            .get(format!("http://{web}/api/runs"))
            .send()
            .await?
            .json()
            .await?;
        if rows.as_array().is_some_and(|r| !r.is_empty()) || t.elapsed() > Duration::from_secs(10) {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rows[0]["run_id"], "run-before", "{rows}");
    assert_eq!(rows[0]["tenant"], TENANT, "{rows}");
    assert_eq!(rows[0]["status"], "completed", "{rows}");
    let stream = http
        .get(format!(
            "http://{web}/v1/runs/{TENANT}/run-before/events?wait=5"
        ))
        .send()
        .await?
        .text()
        .await?;
    let seqs: Vec<u64> = stream
        .lines()
        .filter(|l| l.starts_with("id: "))
        .filter_map(|l| l[4..].trim().parse().ok())
        .collect();
    assert_eq!(
        seqs,
        (1..=TOOL_LOOP.len() as u64).collect::<Vec<_>>(),
        "{stream}"
    );
    Ok(())
}

/// A claude-cli style tool loop: thinking (3 s) → commentary → Bash with its result →
/// thinking (2 s) → a markdown answer streamed as commentary (a heading, a `>` quote, a
/// table and a fenced `sh` block) and then claimed by the final answer.
const TOOL_LOOP: &[&str] = &[
    r###"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"claude-cli","model":"claude-test"}}"###,
    r###"{"seq":2,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"th_1"}}"###,
    r###"{"seq":3,"stream":"thinking","data":{"variant":"raw","delta":"I should count the lines of each file.","id":"th_1"}}"###,
    r###"{"seq":4,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"th_1"}}"###,
    r###"{"seq":5,"stream":"assistant","data":{"phase":"commentary","delta":"Let me count them with wc.","id":"c_1","status":"in_progress"}}"###,
    r###"{"seq":6,"stream":"item","data":{"phase":"start","id":"toolu_1","kind":"tool","name":"Bash","status":"in_progress","input":{"command":"wc -l *.md"}}}"###,
    r###"{"seq":7,"stream":"item","data":{"phase":"end","id":"toolu_1","kind":"tool","name":"Bash","status":"completed","arguments":{"command":"wc -l *.md"},"result":"  12 README.md\n  30 NOTES.md\n  42 total"}}"###,
    r###"{"seq":8,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"th_2"}}"###,
    r###"{"seq":9,"stream":"thinking","data":{"variant":"raw","delta":"Both counted; summarize as a table.","id":"th_2"}}"###,
    r###"{"seq":10,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"th_2"}}"###,
    r###"{"seq":11,"stream":"assistant","data":{"phase":"commentary","delta":"## Line counts\n\n> Counted with `wc -l`.\n\n","id":"c_2","status":"in_progress"}}"###,
    r###"{"seq":12,"stream":"assistant","data":{"phase":"commentary","delta":"| file | lines |\n|---|---|\n| README.md | 12 |\n| NOTES.md | 30 |\n\n```sh\nwc -l *.md\n```\n","id":"c_2","status":"in_progress"}}"###,
    r###"{"seq":13,"stream":"assistant","data":{"phase":"final_answer","text":"## Line counts\n\n> Counted with `wc -l`.\n\n| file | lines |\n|---|---|\n| README.md | 12 |\n| NOTES.md | 30 |\n\n```sh\nwc -l *.md\n```\n","id":"c_2","status":"completed"}}"###,
    r###"{"seq":14,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"###,
];

/// A short ended run whose answer tries to run script in the page.
const XSS_RUN: &[&str] = &[
    r###"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"anthropic","model":"claude-test"}}"###,
    r###"{"seq":2,"stream":"assistant","data":{"phase":"final_answer","text":"# Totally safe\n\n<script>window.__xss='script';document.title='pwned'</script>\n\n<img src=x onerror=\"window.__xss='onerror';document.title='pwned'\">\n\n[click](javascript:window.__xss='link') <b onmouseover=\"window.__xss='hover'\">bold</b>","id":"msg_1","status":"completed"}}"###,
    r###"{"seq":3,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"###,
];

/// Where test artifacts go: `<target dir>/artifacts`.
fn artifacts_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("artifacts")
}

/// What the browser shows (its own DOM, not what the server sent): the run's blocks in
/// DOM order with their kinds, the thinking blocks with their labels and event times,
/// the tool rows, the answer, the run list, and the layout and colours.
const DOM_PROBE: &str = r#"(() => {
  const q = s => document.querySelector(s);
  const all = s => [...document.querySelectorAll(s)];
  const answer = q('#blocks .answer .md');
  const main = q('#main');
  return {
    sse: document.body?.dataset.sse || '',
    status: document.body?.dataset.status || '',
    badge: q('#badge')?.innerText ?? '',
    meta: q('#meta')?.innerText ?? '',
    empty: q('#empty-title')?.innerText ?? '',
    conn: q('#conn')?.innerText ?? '',
    gone: q('#gone') && !q('#gone').hidden ? q('#gone').innerText : '',
    kinds: all('#blocks > .block').map(b => b.dataset.kind),
    thinking: all('#blocks details.thinking').map(d => ({
      summary: d.querySelector('summary')?.innerText ?? '', open: d.open,
      text: d.querySelector('.thought')?.textContent ?? '',
      start: Number(d.dataset.startMs), end: d.dataset.endMs ? Number(d.dataset.endMs) : null })),
    tools: all('#blocks details.tool').map(d => ({
      summary: d.querySelector('summary')?.innerText ?? '',
      body: d.querySelector('.tool-body')?.textContent ?? '',
      state: [...d.classList].find(c => !['block', 'tool'].includes(c)) ?? '' })),
    commentary: all('#blocks .commentary .md').map(e => e.innerText),
    commentary_quotes: all('#blocks .commentary blockquote').length,
    commentary_headings: all('#blocks .commentary h2').map(h => h.innerText),
    answer_text: answer?.innerText ?? '',
    answer_html: answer?.innerHTML ?? '',
    headings: answer ? [...answer.querySelectorAll('h1,h2,h3')].map(h => h.innerText) : [],
    quotes: answer ? answer.querySelectorAll('blockquote').length : 0,
    code_langs: answer ? [...answer.querySelectorAll('.code-lang')].map(e => e.innerText) : [],
    highlighted: answer ? answer.querySelectorAll('code.hljs').length : 0,
    copy_buttons: answer ? answer.querySelectorAll('button.copy').length : 0,
    runs: all('#runs .run-item').map(b => ({ run: b.dataset.run, tenant: b.dataset.tenant, status: b.dataset.status, text: b.innerText })),
    title: document.title,
    xss: window.__xss ?? null,
    scroll_width: document.documentElement?.scrollWidth ?? -1,
    main_scroll_width: main ? main.scrollWidth : 0,
    main_width: main ? main.clientWidth : 0,
    inner_width: innerWidth,
    answer_width: answer ? answer.getBoundingClientRect().width : 0,
    sidebar_left: q('#sidebar')?.getBoundingClientRect().right ?? 0,
    bg: document.body ? getComputedStyle(document.body).backgroundColor : '',
  };
})()"#;

fn strings(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The tool loop's events with their ingest times: 10 ms apart, thinking 1 taking 3 s
/// and thinking 2 taking 2 s of event time.
fn tool_loop_events(run: &str, t0: i64) -> Result<Vec<RunEvent>, Box<dyn std::error::Error>> {
    let mut evs = run_events(run, "chat-loop", &canonical(TOOL_LOOP)?, t0);
    for e in &mut evs {
        if e.event.seq >= 4 {
            e.envelope.ts_ms += 3_000;
        }
        if e.event.seq >= 10 {
            e.envelope.ts_ms += 2_000;
        }
    }
    Ok(evs)
}

/// Issue "the web page on the run stream", as a person sees it in headless Chromium: a
/// deep link opened before its run starts waits, then shows the live tool loop; at five
/// points of the run the DOM shows exactly the events' blocks in their order and kinds
/// (the `>` quote of the answer is a quote in the answer, never a thinking block; the
/// heading is a heading); the settled "Thought for N s" equal the events' timestamps; the
/// code block has its language label, highlighting and a copy button that copies its
/// text. Then the same page at 390×844 (no horizontal scroll, answer ≥ 300 px) and in the
/// dark scheme. Screenshots in `target/artifacts/web-*.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_page_follows_a_live_tool_loop_in_event_order() -> R {
    let (_nats, js, _running, web) = web_page().await?;
    let evs = tool_loop_events("run-loop", now_ms() - 6_000)?;
    let url = format!("http://{web}/?run=run-loop&tenant={TENANT}");
    let Some(mut browser) = cdp::Browser::launch(&url, 1280, 900).await? else {
        return Ok(());
    };
    let (waiting, ok) = browser
        .wait_for(DOM_PROBE, Duration::from_secs(30), |v| {
            v["badge"] == "Waiting for the run…" && v["gone"] != ""
        })
        .await?;
    assert!(ok, "a deep link to a run not started yet: {waiting}");
    assert!(
        waiting["gone"]
            .as_str()
            .is_some_and(|g| g.contains(&format!("streamgate replay run-loop --tenant {TENANT}"))),
        "the replay command for a run the stream may no longer hold: {waiting}"
    );
    browser
        .screenshot(&artifacts_dir().join("web-waiting.png"))
        .await?;
    let artifacts = artifacts_dir();
    // (publish up to seq, the block kinds the page must show then)
    let points: [(usize, &[&str]); 5] = [
        (3, &["thinking"]),
        (5, &["thinking", "commentary"]),
        (7, &["thinking", "commentary", "tool"]),
        (
            11,
            &["thinking", "commentary", "tool", "thinking", "commentary"],
        ),
        (
            14,
            &["thinking", "commentary", "tool", "thinking", "answer"],
        ),
    ];
    let mut published = 0;
    let mut last = serde_json::Value::Null;
    for (i, (upto, kinds)) in points.iter().enumerate() {
        publish(&js, &evs[published..*upto]).await?;
        published = *upto;
        let want: Vec<String> = kinds.iter().map(|k| (*k).to_owned()).collect();
        let (v, ok) = browser
            .wait_for(DOM_PROBE, Duration::from_secs(20), |v| {
                strings(v, "kinds") == want
                    && v["gone"] == ""
                    && (*upto < 14 || v["status"] == "completed" && v["highlighted"] == 1)
                    && (*upto != 11 || v["commentary_quotes"] == 1)
            })
            .await?;
        browser
            .screenshot(&artifacts.join(format!("web-point-{}.png", i + 1)))
            .await?;
        assert!(ok, "point {} (events 1..={upto}): {v}", i + 1);
        if *upto < 14 {
            assert!(v["badge"] == "● Live", "point {}: {v}", i + 1);
        }
        last = v;
    }
    // Live, the answer streamed as commentary: the quote is a quote, the heading a heading.
    // Settled: thought durations are the events' timestamps.
    let thinking = last["thinking"].as_array().ok_or("no thinking")?;
    assert_eq!(thinking.len(), 2, "{last}");
    for (t, (start_seq, end_seq, secs)) in thinking.iter().zip([(2u64, 4u64, 3), (8, 10, 2)]) {
        let ts = |seq: u64| evs[usize::try_from(seq - 1).unwrap_or(0)].envelope.ts_ms;
        assert_eq!(t["start"], ts(start_seq), "{t}");
        assert_eq!(t["end"], ts(end_seq), "{t}");
        assert_eq!(t["summary"], format!("Thought for {secs} s"), "{t}");
        assert_eq!(t["open"], false, "settled thinking is collapsed: {t}");
    }
    assert!(
        thinking[0]["text"] == "I should count the lines of each file.",
        "{last}"
    );
    let tools = last["tools"].as_array().ok_or("no tools")?;
    assert_eq!(tools.len(), 1, "{last}");
    assert_eq!(tools[0]["state"], "done", "{last}");
    let summary = tools[0]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("Bash") && summary.contains("done"),
        "{last}"
    );
    let body = tools[0]["body"].as_str().unwrap_or_default();
    assert!(
        body.contains("wc -l *.md") && body.contains("42 total"),
        "the row expands to its input and output: {last}"
    );
    assert_eq!(
        strings(&last, "commentary"),
        vec!["Let me count them with wc."],
        "{last}"
    );
    assert_eq!(strings(&last, "headings"), vec!["Line counts"], "{last}");
    assert_eq!(last["quotes"], 1, "{last}");
    let text = last["answer_text"].as_str().unwrap_or_default();
    assert!(!text.contains("##") && text.contains("README.md"), "{last}");
    assert_eq!(strings(&last, "code_langs"), vec!["sh"], "{last}");
    assert_eq!(last["copy_buttons"], 1, "{last}");
    assert!(
        last["meta"].as_str().is_some_and(|m| m.contains(TENANT)
            && m.contains("chat-loop")
            && m.contains("claude-test")),
        "tenant, session and model shown: {last}"
    );
    let (listed, ok) = browser
        .wait_for(DOM_PROBE, Duration::from_secs(20), |v| {
            v["runs"].as_array().is_some_and(|runs| {
                runs.iter()
                    .any(|r| r["run"] == "run-loop" && r["status"] == "completed")
            })
        })
        .await?;
    assert!(ok, "the list was never pushed the ended run: {listed}");
    browser
        .screenshot(&artifacts.join("web-desktop.png"))
        .await?;

    // Copy: the button puts the code block's text on the clipboard.
    let origin = format!("http://{web}");
    let _ = browser
        .call(
            "Browser.grantPermissions",
            serde_json::json!({"origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}),
        )
        .await;
    browser
        .eval("document.querySelector('#blocks .answer button.copy').click()")
        .await?;
    let (copied, ok) = browser
        .wait_for(
            "document.body.dataset.copied ?? ''",
            Duration::from_secs(5),
            |v| v.as_str().is_some_and(|s| !s.is_empty()),
        )
        .await?;
    assert!(ok, "copy did not report success: {copied}");
    assert_eq!(copied, "wc -l *.md\n");
    if let Ok(clip) = browser
        .eval("navigator.clipboard.readText().catch(() => null)")
        .await
    {
        if let Some(clip) = clip.as_str() {
            assert_eq!(clip, "wc -l *.md\n", "clipboard");
        }
    }

    // A phone: the list is a drawer, the run has the width.
    browser
        .call(
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let phone = browser.eval(DOM_PROBE).await?;
    browser.screenshot(&artifacts.join("web-phone.png")).await?;
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    assert_eq!(num(&phone, "inner_width"), 390.0, "{phone}");
    assert!(
        num(&phone, "scroll_width") <= 390.0
            && num(&phone, "main_scroll_width") <= num(&phone, "main_width"),
        "horizontal scroll on a phone: {phone}"
    );
    assert!(num(&phone, "answer_width") >= 300.0, "{phone}");
    assert!(
        num(&phone, "sidebar_left") <= 0.0,
        "the list covers the run: {phone}"
    );
    browser
        .eval("document.getElementById('menu').click()")
        .await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let drawer = browser.eval(DOM_PROBE).await?;
    browser
        .screenshot(&artifacts.join("web-phone-runs.png"))
        .await?;
    assert!(num(&drawer, "sidebar_left") > 200.0, "the drawer: {drawer}");
    browser
        .eval("document.getElementById('scrim').click()")
        .await?;

    // Dark: from the system's scheme.
    browser
        .call(
            "Emulation.clearDeviceMetricsOverride",
            serde_json::json!({}),
        )
        .await?;
    let light_bg = browser.eval(DOM_PROBE).await?["bg"].clone();
    browser
        .call(
            "Emulation.setEmulatedMedia",
            serde_json::json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dark = browser.eval(DOM_PROBE).await?;
    browser.screenshot(&artifacts.join("web-dark.png")).await?;
    browser.close().await;
    assert_ne!(
        dark["bg"], light_bg,
        "the dark scheme looks the same: {dark}"
    );
    eprintln!("screenshots in {}", artifacts.display());
    Ok(())
}

/// A Gemini-style turn that stops to ask for a function call: the row says "requested",
/// not "done", and the run is not shown as having run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_page_shows_a_requested_tool_call_as_requested() -> R {
    const REQUESTED: &[&str] = &[
        r###"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"gemini","model":"gemini-test"}}"###,
        r###"{"seq":2,"stream":"item","data":{"phase":"start","id":"call_0","index":0,"kind":"tool","name":"get_weather","status":"in_progress","input":{"city":"Tokyo"}}}"###,
        r###"{"seq":3,"stream":"item","data":{"phase":"end","id":"call_0","index":0,"kind":"tool","name":"get_weather","status":"completed","arguments":{"city":"Tokyo"}}}"###,
        r###"{"seq":4,"stream":"lifecycle","data":{"phase":"end","reason":"tool_use","status":"completed"}}"###,
    ];
    let (_nats, js, _running, web) = web_page().await?;
    publish(
        &js,
        &run_events("run-ask", "chat-ask", &canonical(REQUESTED)?, now_ms()),
    )
    .await?;
    let url = format!("http://{web}/?run=run-ask&tenant={TENANT}");
    let Some(mut browser) = cdp::Browser::launch(&url, 1000, 700).await? else {
        return Ok(());
    };
    let (v, ok) = browser
        .wait_for(DOM_PROBE, Duration::from_secs(30), |v| {
            v["status"] == "completed" && v["tools"].as_array().is_some_and(|t| t.len() == 1)
        })
        .await?;
    browser.close().await;
    assert!(ok, "{v}");
    assert_eq!(v["tools"][0]["state"], "requested", "{v}");
    let summary = v["tools"][0]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("get_weather")
            && summary.contains("requested")
            && !summary.contains("done"),
        "{v}"
    );
    Ok(())
}

/// Model output is untrusted: an answer with a `<script>`, an `onerror=` image, a
/// `javascript:` link and an event-handler attribute must not run any of them in the
/// browser (each would set `window.__xss` and the title). It reads as text instead. The
/// page is open (idle) before the run arrives: the list is pushed, and the run opens by
/// a click.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_page_never_runs_script_from_an_answer() -> R {
    let events = canonical(XSS_RUN)?;
    let (_nats, js, _running, web) = web_page().await?;
    let Some(mut browser) = cdp::Browser::launch(&format!("http://{web}/"), 1280, 700).await?
    else {
        return Ok(());
    };
    let (idle, ok) = browser
        .wait_for(DOM_PROBE, Duration::from_secs(30), |v| v["conn"] == "idle")
        .await?;
    assert!(ok, "idle page: {idle}");
    assert_eq!(idle["empty"], "Waiting for runs", "{idle}");
    browser
        .screenshot(&artifacts_dir().join("web-idle.png"))
        .await?;

    publish(&js, &run_events("run-xss", "chat-xss", &events, now_ms())).await?;
    let (listed, ok) = browser
        .wait_for(DOM_PROBE, Duration::from_secs(30), |v| {
            v["runs"].as_array().is_some_and(|r| !r.is_empty())
        })
        .await?;
    assert!(ok, "the run never listed: {listed}");
    browser
        .eval("document.querySelector('#runs .run-item').click()")
        .await?;
    let (shown, ok) = browser
        .wait_for(DOM_PROBE, Duration::from_secs(30), |v| {
            !v["headings"].as_array().is_none_or(Vec::is_empty)
        })
        .await?;
    assert!(ok, "the answer never showed: {shown}");
    // Give anything that could fire (image error, timers) the time to.
    tokio::time::sleep(Duration::from_millis(800)).await;
    browser
        .eval("document.querySelector('#blocks .answer b')?.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))")
        .await?;
    browser
        .eval("document.querySelector('#blocks .answer a')?.click()")
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = browser.eval(DOM_PROBE).await?;
    let active = browser
        .eval(
            r#"[...document.querySelectorAll('#blocks *')].flatMap(e =>
                 ['SCRIPT', 'IMG', 'IFRAME', 'OBJECT', 'EMBED'].includes(e.tagName) ? [e.tagName]
                 : [...e.attributes].filter(a => a.name.startsWith('on')
                     || /^\s*javascript:/i.test(a.value)).map(a => e.tagName + '@' + a.name))"#,
        )
        .await?;
    browser
        .screenshot(&artifacts_dir().join("web-xss.png"))
        .await?;
    browser.close().await;
    assert_eq!(after["xss"], serde_json::Value::Null, "script ran: {after}");
    assert!(
        !after["title"]
            .as_str()
            .unwrap_or_default()
            .contains("pwned"),
        "{after}"
    );
    assert_eq!(strings(&after, "headings"), vec!["Totally safe"], "{after}");
    assert_eq!(active, serde_json::json!([]), "{after}");
    let text = after["answer_text"].as_str().unwrap_or_default();
    assert!(text.contains("<script>"), "{after}");
    Ok(())
}

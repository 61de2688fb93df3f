//! Just enough of the Chrome DevTools protocol to test the web page the way a person
//! sees it: a headless Chromium opens a URL, the test evaluates JavaScript in the page
//! (reading the DOM the browser rendered, not what the server sent) and captures a
//! screenshot. One WebSocket to the page target; commands are answered in order.
//!
//! Chromium comes from `$STREAMGATE_CHROMIUM` or `chromium` / `chromium-browser` /
//! `google-chrome` on `PATH` (CI installs Debian's `chromium`). Missing is an error unless
//! `STREAMGATE_SKIP_BROWSER=1` opts out ([`Browser::launch`] then returns `Ok(None)`).
#![allow(dead_code)]

use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The opt-out for machines without a browser (CI installs one and never sets it).
pub const SKIP_ENV: &str = "STREAMGATE_SKIP_BROWSER";

/// A headless Chromium showing one page. Killed (with its fresh profile) on drop.
pub struct Browser {
    child: tokio::process::Child,
    ws: Ws,
    next_id: u64,
    _profile: tempfile::TempDir,
}

fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STREAMGATE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|b| std::env::split_paths(&path).map(move |d| d.join(b)))
        .find(|p| p.is_file())
}

/// The DevTools port Chromium picked (`--remote-debugging-port=0`): first line of
/// `DevToolsActivePort` in the profile once it listens.
async fn devtools_port(profile: &Path, child: &mut tokio::process::Child) -> R<u16> {
    let file = profile.join("DevToolsActivePort");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            if let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
                return Ok(port);
            }
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("chromium exited before listening: {status}").into());
        }
        if Instant::now() > deadline {
            return Err("chromium never opened its DevTools port".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Browser {
    /// Starts headless Chromium on `url` with a window of `width`×`height` and connects
    /// to the page. `Ok(None)` only when no Chromium is installed and [`SKIP_ENV`] is set.
    pub async fn launch(url: &str, width: u32, height: u32) -> R<Option<Browser>> {
        let Some(bin) = find_chromium() else {
            if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
                eprintln!("no Chromium installed and {SKIP_ENV}=1: browser checks skipped");
                return Ok(None);
            }
            return Err(format!(
                "no Chromium found (looked for $STREAMGATE_CHROMIUM, chromium, chromium-browser, \
                 google-chrome on PATH): install Debian's `chromium` (scripts/test.sh does), \
                 or set {SKIP_ENV}=1 to skip the browser checks"
            )
            .into());
        };
        let profile = tempfile::tempdir()?;
        let mut child = tokio::process::Command::new(&bin)
            .kill_on_drop(true)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                &format!("--user-data-dir={}", profile.path().display()),
                &format!("--window-size={width},{height}"),
                url,
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let port = devtools_port(profile.path(), &mut child).await?;
        // The page target opened with the URL; its WebSocket is in the target list.
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let ws_url = loop {
            let targets: Value = http
                .get(format!("http://127.0.0.1:{port}/json/list"))
                .send()
                .await?
                .json()
                .await?;
            let page = targets.as_array().and_then(|ts| {
                ts.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
                    .map(str::to_owned)
            });
            if let Some(u) = page {
                break u;
            }
            if Instant::now() > deadline {
                return Err(format!("no page target in {targets}").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str()).await?;
        Ok(Some(Browser {
            child,
            ws,
            next_id: 0,
            _profile: profile,
        }))
    }

    /// Sends one command and returns its `result` (events in between are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> R<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params});
        self.ws.send(Message::text(msg.to_string())).await?;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .map_err(|_| format!("{method}: no answer from chromium"))?;
            let Some(frame) = next else {
                return Err(format!("{method}: chromium closed the connection").into());
            };
            let Message::Text(text) = frame? else {
                continue;
            };
            let v: Value = serde_json::from_str(&text)?;
            if v["id"] != id {
                continue;
            }
            if let Some(err) = v.get("error") {
                return Err(format!("{method}: {err}").into());
            }
            return Ok(v["result"].clone());
        }
    }

    /// Evaluates `expr` in the page and returns its value (JSON-serializable values
    /// only); a thrown exception is an error.
    pub async fn eval(&mut self, expr: &str) -> R<Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(ex) = r.get("exceptionDetails") {
            return Err(format!("page script failed: {ex}").into());
        }
        Ok(r["result"]["value"].clone())
    }

    /// Evaluates `expr` until `done` accepts its value; returns the last value and
    /// whether `done` accepted it within `limit`.
    pub async fn wait_for(
        &mut self,
        expr: &str,
        limit: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> R<(Value, bool)> {
        let t = Instant::now();
        loop {
            let v = self.eval(expr).await?;
            if done(&v) {
                return Ok((v, true));
            }
            if t.elapsed() > limit {
                return Ok((v, false));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a PNG of the viewport to `path` (parent folders created).
    pub async fn screenshot(&mut self, path: &Path) -> R<()> {
        let r = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await?;
        let data = r["data"].as_str().ok_or("screenshot without data")?;
        let png = base64::engine::general_purpose::STANDARD.decode(data)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }

    /// Closes the browser and waits for it to exit.
    pub async fn close(mut self) {
        let _ = self.call("Browser.close", json!({})).await;
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

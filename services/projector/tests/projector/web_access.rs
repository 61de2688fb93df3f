//! The web page is a surface that shows runs: with a channel token it answers only to
//! that token (bearer header, or the cookie `/?token=` sets), and on loopback only to
//! loopback host names (no DNS rebinding).

use streamgate_projector::{start, ChannelConfig, ChannelSink};
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_needs_the_channel_token_and_a_loopback_host() {
    let nats = NatsServer::start();
    let mut cfg = ChannelConfig::new(
        "web",
        ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    cfg.token = Some("page-secret".into());
    let shutdown = CancellationToken::new();
    let running = start(nats.client().await, cfg, None, shutdown.clone())
        .await
        .expect("start the web channel");
    let web = running.web.expect("web listener");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let status = |r: reqwest::Response| r.status().as_u16();

    for path in ["/", "/api/runs", "/runs/r1/events", "/assets/app.js"] {
        let r = client
            .get(format!("http://{web}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(status(r), 401, "{path} without a token");
    }
    let wrong = client
        .get(format!("http://{web}/api/runs"))
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(status(wrong), 401);
    let bearer = client
        .get(format!("http://{web}/api/runs"))
        .header("Authorization", "bearer page-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(status(bearer), 200, "a bearer token in any case");

    // The address `up` prints: the token becomes a cookie and leaves the address.
    let opened = client
        .get(format!("http://{web}/?token=page-secret&run=r1"))
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status().as_u16(), 303);
    let cookie = opened
        .headers()
        .get("set-cookie")
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert_eq!(
        opened
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok()),
        Some("/?run=r1")
    );
    let pair = cookie.split(';').next().unwrap_or_default().to_owned();
    let with_cookie = client
        .get(format!("http://{web}/api/runs"))
        .header("Cookie", pair.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(status(with_cookie), 200);

    // DNS rebinding: another name resolving to this address is turned away.
    let rebound = client
        .get(format!("http://{web}/api/runs"))
        .header("Host", format!("attacker.example:{}", web.port()))
        .header("Cookie", pair)
        .send()
        .await
        .unwrap();
    assert_eq!(status(rebound), 421);
    shutdown.cancel();
}

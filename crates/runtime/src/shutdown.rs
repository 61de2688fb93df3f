//! Graceful shutdown: the first SIGINT/SIGTERM cancels the token so services stop taking
//! work and drain what is in flight; a second signal exits at once.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: draining in-flight work (signal again to exit now)");
        t.cancel();
        wait_for_signal().await;
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

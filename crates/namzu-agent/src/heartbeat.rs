//! The heartbeats a streaming call sends: one message every interval for
//! as long as the call's receiver is there (exec, terminal, TCP).

use std::time::Duration;

/// Sends `beat()` on `tx` every `every` until its receiver is gone.
pub fn spawn<T: Send + 'static>(
    tx: tokio::sync::mpsc::Sender<T>,
    every: Duration,
    beat: fn() -> T,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if tx.send(beat()).await.is_err() {
                return;
            }
        }
    })
}

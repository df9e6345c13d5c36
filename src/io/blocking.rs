//! Blocking file work (a decision log's append, a whole log read) run so that it holds no
//! async loop up: on a multi-threaded runtime `block_in_place` hands this worker's other
//! tasks to another while the call runs (the TUI's runtime); on a current-thread runtime
//! (the headless commands', and tests') or outside one, the call runs here.

/// Runs `f`, a call that may block on the disk, as the module says.
pub fn off_the_loop<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::off_the_loop;
    use std::time::Duration;

    #[test]
    fn a_blocking_call_on_the_only_worker_lets_other_tasks_run() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let heard = rt.block_on(async {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            // The only worker blocks in the call, waiting for a task spawned after it.
            let blocked =
                tokio::spawn(
                    async move { off_the_loop(|| rx.recv_timeout(Duration::from_secs(5))) },
                );
            tokio::time::sleep(Duration::from_millis(200)).await;
            tokio::spawn(async move { tx.send(()) });
            blocked.await.unwrap()
        });
        assert!(
            heard.is_ok(),
            "the other task never ran while the call blocked"
        );
        assert_eq!(off_the_loop(|| 7), 7);
    }
}

//! Support for tests that start ranks (this crate's and the runner's multi-process ones).

/// A port for tests whose rank 0 binds its own (its binding, or its own address, is what
/// they test), for rank processes that need a number to meet at, or where nothing
/// listens: below the OS's ephemeral range (Linux's is 32768-60999), from which come the
/// ports of a bind to port 0 and the local ends of connections, so no other test takes it
/// meanwhile; another at each call (a counter from a start the process id picks, so two
/// test processes differ), and free when picked.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    loop {
        let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = 20_000 + (std::process::id().wrapping_mul(97).wrapping_add(next) % 12_000) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}

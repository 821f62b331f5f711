//! The worker pool is fixed (`mem.count-threads`): a burst of clients
//! sending large appends at once queues on it instead of starting a thread
//! each, and what the burst allocated is given back.

use crate::support::server::*;
use crate::support::session::info_int;

/// used_memory once the burst's connections are gone.
fn used_memory(con: &mut redis::Connection) -> i64 {
    poll_until(con, "the burst's clients to disconnect", |c| {
        info_int(c, "clients", "connected_clients") == 1
    });
    info_int(con, "memory", "used_memory")
}

/// `clients` connections each send one 100 KB append at the same moment.
fn burst(server: &Server, clients: usize, round: usize) {
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let url = server.url();
            std::thread::spawn(move || {
                let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
                let content = format!("burst {round} client {i} ").repeat(4_500);
                let r = map_reply(
                    &mut con,
                    &["MEM.APPEND", &format!("mem:{{c{i}}}"), "user", &content],
                );
                assert_eq!(int_field(&r, "id"), 1);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a client of the burst failed");
    }
}

#[test]
fn a_burst_of_large_appends_queues_on_a_fixed_pool_and_gives_its_memory_back() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(
        server.threads_named("mem-count"),
        0,
        "the pool starts on first use"
    );
    // The first burst starts the pool (and builds its per-thread caches;
    // jemalloc may add a background thread per arena the workers use).
    burst(&server, 60, 0);
    cmd(&mut con, &["FLUSHALL", "SYNC"]).unwrap();
    assert_eq!(info_mem(&mut con, "count_threads"), 2);
    assert_eq!(
        server.threads_named("mem-count"),
        2,
        "60 clients, 2 worker threads"
    );
    // jemalloc may start a background thread on the first use of an arena
    // (Redis 8's FLUSHALL SYNC frees on bio_lazy_free): count the others.
    let base_threads = server.threads() - server.threads_named("jemalloc_bg_thd");
    let baseline = used_memory(&mut con);
    for round in 1..=6 {
        burst(&server, 60, round);
        let threads = server.threads() - server.threads_named("jemalloc_bg_thd");
        assert_eq!(
            threads, base_threads,
            "round {round}: no thread beyond the pool"
        );
        assert_eq!(server.threads_named("mem-count"), 2);
        cmd(&mut con, &["FLUSHALL", "SYNC"]).unwrap();
        let after = used_memory(&mut con);
        assert!(
            (after - baseline).abs() < 2 * 1024 * 1024,
            "round {round}: used_memory {after} vs baseline {baseline} after FLUSHALL"
        );
    }
    // (A worker counts a job done just after handing its result back.)
    poll_until(&mut con, "every append counted on the pool", |c| {
        info_mem(c, "counts_off_thread") == 7 * 60
    });
    assert_eq!(info_mem(&mut con, "count_queue"), 0);
    assert_eq!(info_mem(&mut con, "counts_in_flight"), 0);
    // Resized at run time: one more thread on demand, and back.
    cmd(&mut con, &["CONFIG", "SET", "mem.count-threads", "3"]).unwrap();
    burst(&server, 10, 9);
    assert_eq!(server.threads_named("mem-count"), 3);
    cmd(&mut con, &["CONFIG", "SET", "mem.count-threads", "1"]).unwrap();
    cmd(&mut con, &["FLUSHALL", "SYNC"]).unwrap();
    poll_until(&mut con, "idle threads above the setting to leave", |c| {
        info_mem(c, "count_threads") == 1
    });
    poll_until(&mut con, "the OS threads to exit", |_| {
        server.threads_named("mem-count") == 1
    });
    burst(&server, 5, 10);
    assert_eq!(server.threads_named("mem-count"), 1);
}

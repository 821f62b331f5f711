//! A fixed pool of worker threads for counting large texts (`mem.count-threads`).
//!
//! One OS thread per large append would let any number of clients make any
//! number of threads (each with its own tokenizer caches): the pool keeps the
//! thread count fixed and queues the rest. Threads start on first use; when
//! the setting is lowered, idle threads above it leave; raised, new ones start
//! as work arrives.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

pub type Job = Box<dyn FnOnce() + Send + 'static>;

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    queue: VecDeque::new(),
    threads: 0,
    idle: 0,
});
static WORK: Condvar = Condvar::new();

/// Jobs run to completion (for INFO mem): counted by the job itself before
/// its result is handed back, so a client that got its reply sees it.
pub static JOBS_DONE: AtomicU64 = AtomicU64::new(0);

pub fn job_done() {
    JOBS_DONE.fetch_add(1, Ordering::Relaxed);
}

fn state() -> MutexGuard<'static, State> {
    // A poisoned lock only means a job panicked outside its guard; the queue
    // itself is still whole.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn wanted() -> usize {
    crate::config::Config::count_threads()
}

/// Queues `job` for a worker. Gives the job back when no worker exists and
/// none can be started (the caller then does the work itself).
pub fn submit(job: Job) -> Result<(), Job> {
    let mut s = state();
    // More jobs waiting than idle workers to take them: start one more.
    if s.queue.len() + 1 > s.idle && s.threads < wanted() {
        let started = std::thread::Builder::new()
            .name("mem-count".into())
            .spawn(worker);
        if started.is_ok() {
            s.threads += 1;
        } else if s.threads == 0 {
            return Err(job);
        }
    }
    s.queue.push_back(job);
    drop(s);
    WORK.notify_one();
    Ok(())
}

fn worker() {
    lower_priority();
    loop {
        let job = {
            let mut s = state();
            loop {
                if s.threads > wanted() {
                    s.threads -= 1;
                    return;
                }
                if let Some(job) = s.queue.pop_front() {
                    break job;
                }
                s.idle += 1;
                s = WORK.wait(s).unwrap_or_else(|e| e.into_inner());
                s.idle -= 1;
            }
        };
        crate::guard::or((), job);
    }
}

/// Counting is background work: a worker yields the CPU to Redis's main
/// thread (nice +10), so other clients' latency holds on a busy machine.
fn lower_priority() {
    // SAFETY: gettid has no preconditions; setpriority only changes the
    // scheduling priority of this thread (a failure is harmless: ignored).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// (threads, queued jobs), for INFO mem.
pub fn gauges() -> (u64, u64) {
    let s = state();
    (s.threads as u64, s.queue.len() as u64)
}

/// Frees `garbage` on a worker (freeing a gigabyte of messages held the
/// main thread 64-88 ms), or here when no worker can take it.
pub fn free_later<T: Send + 'static>(garbage: T) {
    if let Err(job) = submit(Box::new(move || drop(garbage))) {
        job();
    }
}

/// What writes dropped that is large enough to free off the main thread
/// (session/garbage.rs), handed to a worker. Called after every command.
pub fn free_dropped() {
    let dropped = crate::session::garbage::take();
    if !dropped.is_empty() {
        free_later(dropped);
    }
}

/// Wakes idle workers so those above a lowered `mem.count-threads` leave.
pub fn resize() {
    WORK.notify_all();
}

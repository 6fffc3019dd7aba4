//! The load generator: one run of one contender in one scenario, open loop on a fixed
//! schedule (or one caller at a time), with the fleet reset before it, the kill and restart of
//! the scenario on a thread of their own, and the servers' counts of the calls each instance
//! got.

use std::io::{IsTerminal, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Code;

use crate::contenders::{Contender, Svc};
use crate::fleet::pb::fleet_client::FleetClient;
use crate::fleet::pb::{Reply, Req};
use crate::fleet::{Fleet, Shared};
use crate::scenarios::{costly, Setup, COLD, COLD_CALLS, FAST};

/// The schedule of one run: calls per second (open loop), measured time, warm-up before it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) rate: f64,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
}

/// The outcome of one measured call: its latency from its scheduled start, or its error code.
pub(crate) type CallResult = Result<Duration, Code>;

pub(crate) struct RunResult {
    pub(crate) calls: Vec<CallResult>,
    /// Whether each call went to the expensive method (mixed-methods; else all false).
    pub(crate) costly: Vec<bool>,
    /// From the first measured call's scheduled start to the end of the last successful one
    /// (at least the measured window).
    pub(crate) span: Duration,
    /// Calls that reached each instance during the measured window.
    pub(crate) served: Vec<u64>,
    /// The latest the generator started a call after its scheduled time.
    pub(crate) max_lag: Duration,
}

/// The progress bar on stderr (a terminal only): runs done of all, the time left, the run.
pub(crate) struct Progress {
    done: usize,
    total: usize,
    started: Instant,
    tty: bool,
}

impl Progress {
    pub(crate) fn new(total: usize) -> Progress {
        Progress {
            done: 0,
            total,
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// One more run done.
    pub(crate) fn done_one(&mut self) {
        self.done += 1;
    }

    pub(crate) fn draw(&self, run_frac: f64, label: &str) {
        if !self.tty {
            return;
        }
        let frac = ((self.done as f64 + run_frac.clamp(0.0, 1.0)) / self.total as f64).min(1.0);
        let width = 30;
        let filled = (frac * width as f64).round() as usize;
        let elapsed = self.started.elapsed().as_secs_f64();
        let eta = if frac > 0.01 {
            format!("{:>3.0}s left", elapsed / frac - elapsed)
        } else {
            "    ...".to_owned()
        };
        eprint!(
            "\r[{}{}] {:>3}/{} {eta}  {label:<42}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.done + 1,
            self.total,
        );
        let _ = std::io::stderr().flush();
    }

    pub(crate) fn clear(&self) {
        if self.tty {
            eprint!("\r{:<100}\r", "");
            let _ = std::io::stderr().flush();
        }
    }
}

/// Puts the fleet back in the scenario's state: every instance running, with its behaviour, and
/// no call of an earlier contender still in a handler.
pub(crate) fn reset(fleet: &Mutex<Fleet>, setup: &Setup) {
    let mut fleet = fleet.lock().unwrap();
    for (inst, b) in fleet.instances.iter_mut().zip(&setup.behaviors) {
        if !inst.is_running() {
            inst.restart();
        }
        inst.set(b.clone());
    }
    let start = Instant::now();
    while fleet.instances.iter().any(|i| i.active() > 0) {
        if start.elapsed() > Duration::from_secs(5) {
            eprintln!("warning: calls of the previous contender still in the servers after 5 s");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Armed once the previous contender's calls are over, so none of them takes a cold call.
    if let Some(i) = setup.cold {
        fleet.instances[i].cold_start(COLD_CALLS, COLD, FAST);
    }
}

/// Calls that reached each instance so far (the servers' own counters).
fn served(shared: &[Arc<Shared>]) -> Vec<u64> {
    shared.iter().map(|s| s.served()).collect()
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_one(
    contender: Contender,
    setup: &Setup,
    fleet: &Arc<Mutex<Fleet>>,
    shared: &[Arc<Shared>],
    load: Load,
    deadline: Duration,
    progress: &Progress,
    label: &str,
) -> RunResult {
    if setup.closed_loop {
        return run_closed(contender, setup, shared, load, deadline, progress, label).await;
    }
    let client = FleetClient::new(contender.build(&setup.uris));
    let period = Duration::from_secs_f64(1.0 / load.rate);
    let warmup_calls = (load.warmup.as_secs_f64() * load.rate).round() as u64;
    let measured_calls = ((load.duration.as_secs_f64() * load.rate).round() as u64).max(1);
    let total = warmup_calls + measured_calls;
    let t0 = tokio::time::Instant::now() + Duration::from_millis(5);
    let measure_start = t0 + period * warmup_calls as u32;

    // Kill and restart on a thread of their own (stopping an instance joins its thread).
    let killer = setup.kill.map(|(at_stop, at_restart)| {
        let fleet = fleet.clone();
        let victim = setup.bad[0];
        let stop_at = measure_start.into_std() + load.duration.mul_f64(at_stop);
        let restart_at = measure_start.into_std() + load.duration.mul_f64(at_restart);
        std::thread::spawn(move || {
            std::thread::sleep(stop_at.saturating_duration_since(Instant::now()));
            fleet.lock().unwrap().instances[victim].stop();
            std::thread::sleep(restart_at.saturating_duration_since(Instant::now()));
            fleet.lock().unwrap().instances[victim].restart();
        })
    });

    let mut served_before = None;
    let mut handles = Vec::with_capacity(total as usize);
    let mut max_lag = Duration::ZERO;
    let mut last_draw = Instant::now();
    let mut i = 0u64;
    while i < total {
        let now = tokio::time::Instant::now();
        while i < total {
            let sched = t0 + period * i as u32;
            if sched > now {
                break;
            }
            let measured = i >= warmup_calls;
            if measured && served_before.is_none() {
                served_before = Some(served(shared));
            }
            if measured {
                max_lag = max_lag.max(now - sched);
            }
            let mut client = client.clone();
            let id = i;
            let expensive = setup.mixed && costly(id);
            handles.push(tokio::spawn(async move {
                let r = call(&mut client, id, expensive, deadline).await;
                let end = tokio::time::Instant::now();
                let result = r.map(|()| end - sched);
                (measured, expensive, result, end)
            }));
            i += 1;
        }
        if last_draw.elapsed() > Duration::from_millis(100) {
            let frac = (now.saturating_duration_since(t0)).as_secs_f64()
                / (load.warmup + load.duration).as_secs_f64();
            progress.draw(frac, label);
            last_draw = Instant::now();
        }
        if i < total {
            tokio::time::sleep_until(t0 + period * i as u32).await;
        }
    }
    drop(client);
    progress.draw(1.0, &format!("{label} (last calls)"));

    let mut calls = Vec::with_capacity(measured_calls as usize);
    let mut costly = Vec::with_capacity(measured_calls as usize);
    let mut last_end = measure_start;
    for h in handles {
        let (measured, expensive, result, end) = h.await.expect("call task");
        if measured {
            if result.is_ok() {
                last_end = last_end.max(end);
            }
            calls.push(result);
            costly.push(expensive);
        }
    }
    if let Some(k) = killer {
        k.join().expect("kill thread");
    }
    let after = served(shared);
    let before = served_before.unwrap_or_else(|| after.clone());
    RunResult {
        calls,
        costly,
        span: (last_end - measure_start).max(load.duration),
        served: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        max_lag,
    }
}

/// One caller, one call at a time, for the measured time: each call starts when the one
/// before it has ended, and its latency counts from its start. No warm-up: what is measured
/// starts with the fresh channel (and the cold start the reset armed).
async fn run_closed(
    contender: Contender,
    setup: &Setup,
    shared: &[Arc<Shared>],
    load: Load,
    deadline: Duration,
    progress: &Progress,
    label: &str,
) -> RunResult {
    let mut client = FleetClient::new(contender.build(&setup.uris));
    let before = served(shared);
    let start = tokio::time::Instant::now();
    let end_at = start + load.duration;
    let mut calls = Vec::new();
    let mut last_end = start;
    let mut last_draw = Instant::now();
    let mut id = 0u64;
    while tokio::time::Instant::now() < end_at {
        let begun = tokio::time::Instant::now();
        let r = call(&mut client, id, false, deadline).await;
        let end = tokio::time::Instant::now();
        if r.is_ok() {
            last_end = end;
        }
        calls.push(r.map(|()| end - begun));
        id += 1;
        if last_draw.elapsed() > Duration::from_millis(100) {
            progress.draw(
                (end - start).as_secs_f64() / load.duration.as_secs_f64(),
                label,
            );
            last_draw = Instant::now();
        }
    }
    drop(client);
    let after = served(shared);
    RunResult {
        costly: vec![false; calls.len()],
        calls,
        span: (last_end - start).max(load.duration),
        served: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        max_lag: Duration::ZERO,
    }
}

/// One call with its deadline: Unary, or (`expensive`) ClientStream with one message, which
/// the mixed-methods fleet serves 20x slower. A backstop past the deadline ends a call stuck
/// where `grpc-timeout` does not reach (such as a queue in front of the channel).
pub(crate) async fn call(
    client: &mut FleetClient<Svc>,
    id: u64,
    expensive: bool,
    deadline: Duration,
) -> Result<(), Code> {
    let msg = Req {
        id,
        count: 0,
        payload: Vec::new(),
    };
    let fut = if expensive {
        let mut req = tonic::Request::new(futures::stream::iter([msg]));
        req.set_timeout(deadline);
        client_stream(client, req)
    } else {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(deadline);
        unary(client, req)
    };
    match tokio::time::timeout(deadline + Duration::from_millis(50), fut).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(status.code()),
        Err(_) => Err(Code::DeadlineExceeded),
    }
}

/// One unary call, boxed as a `Send` future: spawning the generated client's future directly
/// trips a rustc limitation on higher-ranked lifetimes ("implementation of `From` is not
/// general enough").
fn unary(
    client: &mut FleetClient<Svc>,
    req: tonic::Request<Req>,
) -> futures::future::BoxFuture<'_, Result<tonic::Response<Reply>, tonic::Status>> {
    Box::pin(client.unary(req))
}

/// One client-streaming call, boxed for the same reason.
fn client_stream(
    client: &mut FleetClient<Svc>,
    req: tonic::Request<futures::stream::Iter<std::array::IntoIter<Req, 1>>>,
) -> futures::future::BoxFuture<'_, Result<tonic::Response<Reply>, tonic::Status>> {
    Box::pin(client.client_stream(req))
}

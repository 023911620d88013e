//! What one `/metrics` scrape of `gpumemhook exporter` costs with many hooked processes alive:
//! starts `--processes` (default 1000) sleeping `simrun`s under the hook, each holding a distinct
//! number of bytes, starts the exporter over their segments, checks one scrape has every process
//! with its exact bytes, then times `--scrapes` scrapes (HTTP GET on loopback, response read to the
//! end) and prints min / median / p90 / max, and the exporter's own CPU time per scrape (user +
//! system, from `/proc`: on a shared machine the wall times grow with the load, the CPU time much
//! less). Everything it started is killed at the end.
//!
//! Usage: `exporter_scrape --hook libgpumemhook.so --sim target/sim --cli target/release/gpumemhook
//! [--processes 1000] [--scrapes 30]`. Run by `scripts/bench/cpu --exporter` (see BENCHMARKS.md);
//! not a test: nothing is asserted about the time.

use gpumemhook_bench::{median, quantile, Args};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Children killed (and reaped) when dropped, even on a panic.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the exporter");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(
            b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: application/openmetrics-text; \
              version=1.0.0\r\n\r\n",
        )
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the response");
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    text
}

/// `(pid, used)` of every `gpumemhook_used_bytes` sample.
fn used_samples(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter(|l| l.starts_with("gpumemhook_used_bytes{"))
        .filter_map(|l| {
            let pid = l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok()?;
            let used = l.rsplit(' ').next()?.parse().ok()?;
            Some((pid, used))
        })
        .collect()
}

/// User + system CPU seconds `pid` has used (fields 14 and 15 of `/proc/<pid>/stat`).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0)) as f64 / ticks
}

fn main() {
    let args = Args::parse().unwrap_or_else(|e| {
        eprintln!("exporter_scrape: {e}");
        std::process::exit(2)
    });
    let path = |name: &str| -> PathBuf {
        args.string(name).map(PathBuf::from).unwrap_or_else(|| {
            eprintln!("exporter_scrape: --{name} is required");
            std::process::exit(2)
        })
    };
    let (hook, sim, cli) = (path("hook"), path("sim"), path("cli"));
    let number = |name: &str, default: u64| {
        args.number(name, default).unwrap_or_else(|e| {
            eprintln!("exporter_scrape: {e}");
            std::process::exit(2)
        }) as usize
    };
    let (count, scrapes) = (number("processes", 1000), number("scrapes", 30));

    // Segments on tmpfs, as in production (/dev/shm), in a directory of this run's own.
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let shm = base.join(format!("gpumemhook-bench-exporter-{}", std::process::id()));
    std::fs::create_dir_all(&shm).expect("segment directory");

    eprintln!("exporter_scrape: starting {count} hooked simrun processes");
    let started = Instant::now();
    let mut sleepers = Children(Vec::with_capacity(count));
    for i in 0..count {
        let child = Command::new(sim.join("simrun"))
            .args([format!("rt.malloc:a:{}", 1000 + i), "sleep:600000".into()])
            .env("LD_PRELOAD", &hook)
            .env("LD_LIBRARY_PATH", &sim)
            .env("GPUMEMHOOK_SHM_DIR", &shm)
            .env_remove("GPUMEMHOOK_REPORT")
            .env_remove("GPUMEMHOOK_TRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("simrun starts");
        sleepers.0.push(child);
    }
    let mut exporter = Children(vec![Command::new(&cli)
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .env("GPUMEMHOOK_SHM_DIR", &shm)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the exporter starts")]);
    let mut line = String::new();
    BufReader::new(exporter.0[0].stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));

    // Every process allocated: one scrape shows all of them with their exact bytes.
    let deadline = Instant::now() + Duration::from_secs(300);
    let text = loop {
        let text = scrape(addr);
        if used_samples(&text).len() == count {
            break text;
        }
        assert!(Instant::now() < deadline, "not all processes appeared");
        std::thread::sleep(Duration::from_millis(200));
    };
    let expected: std::collections::BTreeMap<u32, u64> = sleepers
        .0
        .iter()
        .enumerate()
        .map(|(i, c)| (c.id(), 1000 + i as u64))
        .collect();
    let found: std::collections::BTreeMap<u32, u64> = used_samples(&text).into_iter().collect();
    assert_eq!(found, expected, "every process with its exact bytes");
    eprintln!(
        "exporter_scrape: {count} processes up in {:.1} s; one scrape: {} bytes, {} lines",
        started.elapsed().as_secs_f64(),
        text.len(),
        text.lines().count()
    );

    let exporter_pid = exporter.0[0].id();
    let cpu_before = cpu_seconds(exporter_pid);
    let mut times = Vec::with_capacity(scrapes);
    for _ in 0..scrapes {
        let start = Instant::now();
        let text = scrape(addr);
        times.push(start.elapsed().as_secs_f64() * 1e3);
        assert_eq!(used_samples(&text).len(), count);
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpu_ms = (cpu_seconds(exporter_pid) - cpu_before) * 1e3 / scrapes as f64;
    println!(
        "exporter scrape, {count} hooked processes, {scrapes} scrapes (ms): min {:.1}  median {:.1}  \
         p90 {:.1}  max {:.1}; exporter CPU {cpu_ms:.1} ms per scrape; load average {}",
        quantile(&times, 0.0),
        median(&times),
        quantile(&times, 0.9),
        quantile(&times, 1.0),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    drop(exporter);
    drop(sleepers);
    let _ = std::fs::remove_dir_all(&shm);
}

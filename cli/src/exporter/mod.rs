//! `gpumemhook exporter`: serves `/metrics`, the counters of every live hooked process of this
//! machine, for Prometheus to scrape.
//!
//! Each scrape lists the segments anew, reads them and lets them go once its response is sent:
//! nothing is cached and no file stays open or mapped between scrapes, so a process that exits is
//! gone from the next scrape, and one that starts is in it. Run as root, the exporter reads every
//! user's processes; otherwise its own user's.
//!
//! In two parts: [`metrics`] (reading the processes and writing the exposition text, OpenMetrics or
//! the Prometheus text format) and [`serve`] (the HTTP server around it); this file holds the
//! command: its options checked, then one scrape printed or the server started.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener};

use crate::usage::UsageError;

mod metrics;
mod serve;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook exporter                          # http://127.0.0.1:9464/metrics
  gpumemhook exporter --listen 127.0.0.1:0     # any free port (printed on stderr)
  sudo gpumemhook exporter                     # every user's processes
  gpumemhook exporter --listen 0.0.0.0:9464 --allow-remote   # for a Prometheus on another host
  gpumemhook exporter --once                   # print one scrape and exit

Metrics, per process and device (labels pid, user, command, device, and where known job_name,
rank, local_rank, world_size, torchelastic_run_id, slurm_job_id, slurm_procid, ray_job_id,
pod_name, pod_namespace, job_id): gpumemhook_used_bytes, gpumemhook_peak_bytes, gpumemhook_limit_bytes (only with a
ceiling), gpumemhook_allocations_total, gpumemhook_frees_total, gpumemhook_denied_total,
gpumemhook_failed_total; gpumemhook_module_used_bytes (with a module label: the shared object
that asked for the memory); and gpumemhook_processes (hooked processes alive, idle ones included).")]
pub struct ExporterArgs {
    /// Address and port to serve `/metrics` on (port 0: any free one).
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Allow an address other than loopback (the metrics name users, commands and jobs).
    #[arg(long)]
    pub allow_remote: bool,
    /// Print one scrape's metrics on stdout and exit, serving nothing.
    #[arg(long)]
    pub once: bool,
}

pub fn exporter(args: ExporterArgs) -> Result<i32> {
    let all_users = is_root();
    if args.once {
        crate::console::print_or_end(&metrics::scrape(all_users)?)?;
        return Ok(0);
    }
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        bail!(UsageError(format!(
            "{} is not a loopback address: the metrics name users, commands and jobs, so serving \
             them beyond this machine needs --allow-remote",
            args.listen
        )));
    }
    let listener = TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let bound = listener.local_addr().context("the address listened on")?;
    sayln!(
        "gpumemhook exporter: serving http://{bound}/metrics ({})",
        if all_users {
            "every user's hooked processes"
        } else {
            "this user's hooked processes; as root it serves every user's"
        }
    );
    serve::serve(listener, all_users);
    Ok(0)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

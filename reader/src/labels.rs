//! Job labels: where a process belongs in a bigger run (the job its user named, its Ray job, its
//! torchrun rank, its Slurm job, its Kubernetes pod), read from the environment the process started
//! with and kept in its segment, so `ls`, `top`, `report` and the exporter can show them and `ls
//! --group job` can sum a job's ranks.
//!
//! The hook records them once, when it creates the segment, from `/proc/self/environ`: the
//! environment the program image was started with. That file needs no lock (reading `environ`
//! through `std::env` takes one, which a forked child could find held forever) and is what
//! launchers set: torchrun, `srun`, Ray's raylet and the kubelet all hand these variables to a new
//! program. A variable a program sets in itself after it started (as Ray Train sets `RANK` inside
//! its workers) is not seen.
//!
//! In the segment the labels are one NUL-padded text field of `VARIABLE=value` lines
//! ([`JOB_LABELS_LEN`] bytes). Readers keep only the variables of [`JOB_VARIABLES`] and clean every
//! value ([`clean_value`]), so a hostile segment can put at most a short printable string into a
//! label.

use crate::env;
use gpumemhook_segment::layout::{Segment, JOB_LABELS_LEN};
use gpumemhook_segment::text::{read_text, write_text};
use serde::{Deserialize, Serialize};

/// Longest value kept, in bytes: a Kubernetes pod name (a DNS subdomain) is at most 253.
pub const MAX_VALUE_LEN: usize = 253;

/// The environment variables recorded, and the label each becomes, in order of precedence: where
/// several variables feed one label, the first of them set (to a value not empty once cleaned)
/// wins, so the user's `GPUMEMHOOK_RANK` wins over torchrun's `RANK`.
///
/// `TORCHELASTIC_RUN_ID` is torchrun's rendezvous id (a fresh UUID with `--standalone`): the one
/// variable torchrun sets that is the same for every rank of one job and differs between jobs.
/// `RAY_JOB_ID` is the hex job id Ray's raylet gives every worker process it starts for a job (it
/// gives no worker or actor id: those are assigned after the process started).
pub const JOB_VARIABLES: [(&str, &str); 13] = [
    (env::JOB, "job_name"),
    (env::GROUP, "group"),
    (env::RANK, "rank"),
    ("RANK", "rank"),
    ("LOCAL_RANK", "local_rank"),
    ("WORLD_SIZE", "world_size"),
    ("TORCHELASTIC_RUN_ID", "torchelastic_run_id"),
    ("SLURM_JOB_ID", "slurm_job_id"),
    ("SLURM_PROCID", "slurm_procid"),
    ("RAY_JOB_ID", "ray_job_id"),
    ("POD_NAME", "pod_name"),
    ("POD_NAMESPACE", "pod_namespace"),
    ("POD_UID", "pod_uid"),
];

/// Declares [`JobLabels`], one optional text per label, with the label of each field spelt once
/// (as the field's name) for [`JobLabels::pairs`] and [`JobLabels::slot_of_label`].
macro_rules! job_labels {
    ($($(#[$doc:meta])* $field:ident,)*) => {
        /// Where a process belongs; every field is absent when none of its variables was set.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct JobLabels {
            $(
                $(#[$doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<String>,
            )*
        }

        impl JobLabels {
            /// `(label, value)` of every label present, in field order.
            pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
                [$((stringify!($field), &self.$field)),*]
                    .into_iter()
                    .filter_map(|(label, value)| Some((label, value.as_deref()?)))
            }

            fn slot_of_label(&mut self, label: &str) -> Option<&mut Option<String>> {
                match label {
                    $(stringify!($field) => Some(&mut self.$field),)*
                    _ => None,
                }
            }
        }
    };
}

job_labels! {
    /// `GPUMEMHOOK_JOB`: the job as its user named it.
    job_name,
    /// `GPUMEMHOOK_GROUP`: the group the process counts in (`crate::group`).
    group,
    /// `GPUMEMHOOK_RANK`, else torchrun's `RANK`.
    rank,
    local_rank,
    world_size,
    torchelastic_run_id,
    slurm_job_id,
    slurm_procid,
    ray_job_id,
    pod_name,
    pod_namespace,
    /// `POD_UID`, else (filled in by a reader that sees the process: [`JobLabels::with_pod_of`])
    /// the pod uid of its cgroup path.
    pod_uid,
}

/// A value as it may appear in a label: control characters dropped, cut to [`MAX_VALUE_LEN`] bytes
/// at a character boundary, surrounding blanks trimmed; `None` when nothing is left.
pub fn clean_value(raw: &str) -> Option<String> {
    let mut value: String = raw.chars().filter(|c| !c.is_control()).collect();
    let mut end = value.len().min(MAX_VALUE_LEN);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value.truncate(end);
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

impl JobLabels {
    /// The labels among `(variable, value)` pairs (an environment); other variables are ignored.
    /// Where several variables feed one label, the first of them in [`JOB_VARIABLES`] with a
    /// value (once cleaned) wins, whatever their order here.
    pub fn from_env_vars<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> JobLabels {
        let mut labels = JobLabels::default();
        // For each label set so far, the index in JOB_VARIABLES of the variable it came from.
        let mut source: Vec<(&str, usize)> = Vec::new();
        for (name, value) in vars {
            let Some(index) = JOB_VARIABLES.iter().position(|(v, _)| *v == name.as_ref()) else {
                continue;
            };
            let Some(value) = clean_value(value.as_ref()) else {
                continue;
            };
            let label = JOB_VARIABLES[index].1;
            match source.iter_mut().find(|(l, _)| *l == label) {
                Some((_, winner)) if *winner < index => continue,
                Some((_, winner)) => *winner = index,
                None => source.push((label, index)),
            }
            if let Some(slot) = labels.slot_of_label(label) {
                *slot = Some(value);
            }
        }
        labels
    }

    /// The labels in the environment this process was started with (`/proc/self/environ`);
    /// none when that file cannot be read.
    pub fn of_this_process() -> JobLabels {
        let raw = std::fs::read("/proc/self/environ").unwrap_or_default();
        JobLabels::from_env_vars(raw.split(|&b| b == 0).filter_map(|entry| {
            let entry = std::str::from_utf8(entry).ok()?;
            entry.split_once('=')
        }))
    }

    pub fn is_empty(&self) -> bool {
        self.pairs().next().is_none()
    }

    /// The job the process is part of, the key `ls --by-job` sums by and the exporter's
    /// `job_id` label. The first source present wins: the user's `GPUMEMHOOK_JOB`, as given;
    /// `ray:<job id>` (Ray's nil id, all `f`, names no job); `slurm:<job id>`;
    /// `torchrun:<rendezvous id>` (torchrun's default id `none` names no job);
    /// `pod:<namespace>/<name>`; `pod:<uid>`. `None` outside all of them.
    ///
    /// Ray comes before Slurm and Kubernetes because its workers inherit the environment of the
    /// node's raylet: a Ray cluster started by `srun` or in a pod hands every job's workers the
    /// same `SLURM_JOB_ID` or `POD_NAME`, which name the cluster, not the job.
    pub fn job_id(&self) -> Option<String> {
        if let Some(name) = &self.job_name {
            return Some(name.clone());
        }
        let ray_job = self.ray_job_id.as_ref();
        if let Some(id) = ray_job.filter(|id| !id.chars().all(|c| c.eq_ignore_ascii_case(&'f'))) {
            return Some(format!("ray:{id}"));
        }
        if let Some(id) = &self.slurm_job_id {
            return Some(format!("slurm:{id}"));
        }
        if let Some(id) = self.torchelastic_run_id.as_ref().filter(|id| *id != "none") {
            return Some(format!("torchrun:{id}"));
        }
        if let Some(pod) = &self.pod_name {
            return Some(format!(
                "pod:{}/{pod}",
                self.pod_namespace.as_deref().unwrap_or("default")
            ));
        }
        self.pod_uid.as_ref().map(|uid| format!("pod:{uid}"))
    }

    /// These labels, with `pod_uid` taken from the cgroup path of process `pid` (a pid of the
    /// reader's namespace) where no pod is named: the node then names a pod's process by its pod
    /// even when the workload set no downward-API variable.
    pub fn with_pod_of(mut self, pid: u32) -> JobLabels {
        if self.pod_name.is_none() && self.pod_uid.is_none() {
            self.pod_uid = gpumemhook_segment::process::pod_uid_of(pid);
        }
        self
    }

    /// A short human form: `rank 3/8 slurm:1234`, empty when no label is set.
    pub fn summary(&self) -> String {
        let mut words = Vec::new();
        match (&self.rank, &self.world_size) {
            (Some(rank), Some(size)) => words.push(format!("rank {rank}/{size}")),
            (Some(rank), None) => words.push(format!("rank {rank}")),
            _ => {}
        }
        if let Some(job) = self.job_id() {
            words.push(job);
        }
        // The group beside the job: `--group NAME` (in `run`, `ls`, `fit`'s trials) is a group.
        if let Some(group) = &self.group {
            words.push(format!("group:{group}"));
        }
        words.join(" ")
    }

    /// The segment text: `VARIABLE=value` lines, each label under the first variable that feeds
    /// it (which wins again when read back); an entry that would not fit is left out whole.
    fn to_text(&self) -> String {
        let mut text = String::new();
        for (label, value) in self.pairs() {
            let variable = JOB_VARIABLES
                .iter()
                .find(|(_, l)| *l == label)
                .map_or(label, |(v, _)| v);
            let line = format!("{variable}={value}\n");
            if text.len() + line.len() < JOB_LABELS_LEN {
                text.push_str(&line);
            }
        }
        text
    }

    /// Parses segment text, keeping only known variables with clean values.
    fn from_text(text: &str) -> JobLabels {
        JobLabels::from_env_vars(text.lines().filter_map(|line| line.split_once('=')))
    }
}

/// The labels' place in a segment (`Header::job_labels`).
impl JobLabels {
    /// Records where the process belongs in `segment` (the hook does this once, before publishing
    /// the segment).
    pub fn write_to(&self, segment: &Segment) {
        write_text(&segment.header.job_labels, &self.to_text());
    }

    /// Where the process belongs, as its hook recorded it in `segment`.
    pub fn read_from(segment: &Segment) -> JobLabels {
        JobLabels::from_text(&read_text(&segment.header.job_labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeroed() -> Box<Segment> {
        // SAFETY: every field of `Segment` is an atomic integer (or an array of them), for which
        // the all-zero bit pattern is a valid value.
        unsafe { Box::new_zeroed().assume_init() }
    }

    #[test]
    fn known_variables_become_labels_and_others_are_ignored() {
        let labels = JobLabels::from_env_vars([
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("SLURM_JOB_ID", "4242"),
            ("HOME", "/root"),
            ("POD_NAME", "   "),
        ]);
        assert_eq!(
            labels.pairs().collect::<Vec<_>>(),
            [
                ("rank", "3"),
                ("local_rank", "1"),
                ("world_size", "8"),
                ("slurm_job_id", "4242")
            ]
        );
        assert_eq!(labels.job_id().as_deref(), Some("slurm:4242"));
        assert_eq!(labels.summary(), "rank 3/8 slurm:4242");
    }

    #[test]
    fn the_job_is_slurm_then_torchrun_then_pod() {
        let torchrun = JobLabels::from_env_vars([("TORCHELASTIC_RUN_ID", "abc")]);
        assert_eq!(torchrun.job_id().as_deref(), Some("torchrun:abc"));
        let default_id = JobLabels::from_env_vars([("TORCHELASTIC_RUN_ID", "none")]);
        assert_eq!(default_id.job_id(), None);
        let pod = JobLabels::from_env_vars([
            ("TORCHELASTIC_RUN_ID", "none"),
            ("POD_NAME", "train-0"),
            ("POD_NAMESPACE", "ml"),
        ]);
        assert_eq!(pod.job_id().as_deref(), Some("pod:ml/train-0"));
        assert!(JobLabels::default().is_empty());
        assert_eq!(JobLabels::default().summary(), "");
        let grouped = JobLabels {
            group: Some("job".into()),
            ..JobLabels::default()
        };
        assert_eq!(grouped.summary(), "group:job");
    }

    #[test]
    fn labels_round_trip_through_a_segment() {
        let seg = zeroed();
        let labels = JobLabels::from_env_vars([
            ("RANK", "0"),
            ("POD_NAME", &"p".repeat(300)),
            ("POD_NAMESPACE", "ns"),
            ("SLURM_PROCID", "7"),
        ]);
        assert_eq!(labels.pod_name.as_ref().map(String::len), Some(253));
        labels.write_to(&seg);
        assert_eq!(JobLabels::read_from(&seg), labels);
    }

    #[test]
    fn hostile_segment_text_yields_only_clean_known_labels() {
        let seg = zeroed();
        write_text(
            &seg.header.job_labels,
            "RANK=1\u{1b}[2J\nEVIL=x\nPOD_NAME=a\"b\\c\r\n=\nWORLD_SIZE\nSLURM_JOB_ID=\u{7}\n",
        );
        let labels = JobLabels::read_from(&seg);
        assert_eq!(labels.rank.as_deref(), Some("1[2J"));
        assert_eq!(labels.pod_name.as_deref(), Some("a\"b\\c"));
        assert_eq!(labels.world_size, None);
        assert_eq!(labels.slurm_job_id, None);
        assert_eq!(labels.pairs().count(), 2);
    }

    #[test]
    fn every_variable_feeds_a_label_and_every_label_has_a_variable() {
        let mut labels = JobLabels::default();
        for (variable, label) in JOB_VARIABLES {
            assert!(
                labels.slot_of_label(label).is_some(),
                "{variable}: no field {label}"
            );
        }
        let all = JobLabels::from_env_vars(JOB_VARIABLES.iter().map(|(v, _)| (*v, "x")));
        let labels: Vec<&str> = all.pairs().map(|(label, _)| label).collect();
        let mut distinct: Vec<&str> = JOB_VARIABLES.iter().map(|(_, l)| *l).collect();
        distinct.dedup();
        assert_eq!(labels, distinct);
    }

    #[test]
    fn the_users_job_and_rank_win_over_every_other_source() {
        let env = [
            ("RANK", "5"),
            ("SLURM_JOB_ID", "4242"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("RAY_JOB_ID", "02000000"),
            ("POD_NAME", "train-0"),
            (env::JOB, "nightly"),
            (env::RANK, "3"),
        ];
        let labels = JobLabels::from_env_vars(env);
        assert_eq!(labels.job_id().as_deref(), Some("nightly"));
        assert_eq!(labels.rank.as_deref(), Some("3"));
        assert_eq!(labels.summary(), "rank 3 nightly");
        // The order of the environment does not matter.
        let reversed = JobLabels::from_env_vars(env.iter().rev().copied());
        assert_eq!(reversed, labels);
        // An empty (or blank) value is no value: the next source wins.
        let blank = JobLabels::from_env_vars([(env::JOB, " \t"), (env::RANK, ""), ("RANK", "5")]);
        assert_eq!(blank.job_id(), None);
        assert_eq!(blank.rank.as_deref(), Some("5"));
    }

    #[test]
    fn ray_comes_before_slurm_torchrun_and_pods() {
        let env = [
            ("SLURM_JOB_ID", "4242"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("POD_NAME", "raycluster-worker-0"),
            ("RAY_JOB_ID", "02000000"),
            ("RAY_RAYLET_PID", "77"),
        ];
        let ray = JobLabels::from_env_vars(env);
        assert_eq!(ray.job_id().as_deref(), Some("ray:02000000"));
        assert_eq!(ray.ray_job_id.as_deref(), Some("02000000"));
        // Ray's nil job id names no job; the next source does.
        let nil = JobLabels::from_env_vars([("RAY_JOB_ID", "ffffffff"), ("POD_NAME", "p")]);
        assert_eq!(nil.job_id().as_deref(), Some("pod:default/p"));
    }

    #[test]
    fn the_users_labels_are_cleaned_like_the_others() {
        let long = "j".repeat(400);
        let labels = JobLabels::from_env_vars([
            (env::JOB, "night\u{1b}[2Jly\n".to_string()),
            (env::RANK, long.clone()),
        ]);
        assert_eq!(labels.job_name.as_deref(), Some("night[2Jly"));
        assert_eq!(labels.rank.as_ref().map(String::len), Some(MAX_VALUE_LEN));
        let only_controls = JobLabels::from_env_vars([(env::JOB, "\u{7}\u{1b}\r")]);
        assert!(only_controls.is_empty());
    }

    #[test]
    fn the_users_rank_round_trips_through_a_segment() {
        let seg = zeroed();
        let labels = JobLabels::from_env_vars([("RANK", "5"), (env::RANK, "3"), (env::JOB, "n")]);
        labels.write_to(&seg);
        assert_eq!(JobLabels::read_from(&seg), labels);
        assert_eq!(JobLabels::read_from(&seg).rank.as_deref(), Some("3"));
    }

    #[test]
    fn this_process_reads_its_start_environment() {
        // The test runner may itself run under Slurm or torchrun: compare with what it inherited.
        let expected = JobLabels::from_env_vars(
            std::env::vars().filter(|(k, _)| JOB_VARIABLES.iter().any(|(v, _)| v == k)),
        );
        assert_eq!(JobLabels::of_this_process(), expected);
    }
}

//! Job labels: where a process belongs in a bigger run (its torchrun rank, its Slurm job, its
//! Kubernetes pod), read from the environment the process started with and kept in its segment, so
//! `ls`, `top`, `report` and the exporter can show them and `ls --group job` can sum a job's ranks.
//!
//! The hook records them once, when it creates the segment, from `/proc/self/environ`: the
//! environment the program image was started with. That file needs no lock (reading `environ`
//! through `std::env` takes one, which a forked child could find held forever) and is what
//! launchers set: torchrun, `srun` and the kubelet all hand these variables to a new program.
//!
//! In the segment the labels are one NUL-padded text field of `VARIABLE=value` lines
//! ([`JOB_LABELS_LEN`] bytes). Readers keep only the variables of [`JOB_VARIABLES`] and clean every
//! value ([`clean_value`]), so a hostile segment can put at most a short printable string into a
//! label.

use crate::layout::{read_text, write_text, Segment, JOB_LABELS_LEN};
use serde::{Deserialize, Serialize};

/// Longest value kept, in bytes: a Kubernetes pod name (a DNS subdomain) is at most 253.
pub const MAX_VALUE_LEN: usize = 253;

/// The environment variables recorded, and the label each becomes.
///
/// `TORCHELASTIC_RUN_ID` is torchrun's rendezvous id (a fresh UUID with `--standalone`): the one
/// variable torchrun sets that is the same for every rank of one job and differs between jobs.
pub const JOB_VARIABLES: [(&str, &str); 8] = [
    ("RANK", "rank"),
    ("LOCAL_RANK", "local_rank"),
    ("WORLD_SIZE", "world_size"),
    ("TORCHELASTIC_RUN_ID", "torchelastic_run_id"),
    ("SLURM_JOB_ID", "slurm_job_id"),
    ("SLURM_PROCID", "slurm_procid"),
    ("POD_NAME", "pod_name"),
    ("POD_NAMESPACE", "pod_namespace"),
];

/// Where a process belongs; every field is absent when its variable was not set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLabels {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torchelastic_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_procid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
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
    pub fn from_env_vars<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> JobLabels {
        let mut labels = JobLabels::default();
        for (name, value) in vars {
            if let Some(slot) = labels.slot_of_variable(name.as_ref()) {
                *slot = clean_value(value.as_ref());
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

    /// `(label, value)` of every label present, in [`JOB_VARIABLES`] order.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            &self.rank,
            &self.local_rank,
            &self.world_size,
            &self.torchelastic_run_id,
            &self.slurm_job_id,
            &self.slurm_procid,
            &self.pod_name,
            &self.pod_namespace,
        ]
        .into_iter()
        .zip(JOB_VARIABLES)
        .filter_map(|(value, (_, label))| Some((label, value.as_deref()?)))
    }

    pub fn is_empty(&self) -> bool {
        self.pairs().next().is_none()
    }

    fn slot_of_variable(&mut self, variable: &str) -> Option<&mut Option<String>> {
        Some(match variable {
            "RANK" => &mut self.rank,
            "LOCAL_RANK" => &mut self.local_rank,
            "WORLD_SIZE" => &mut self.world_size,
            "TORCHELASTIC_RUN_ID" => &mut self.torchelastic_run_id,
            "SLURM_JOB_ID" => &mut self.slurm_job_id,
            "SLURM_PROCID" => &mut self.slurm_procid,
            "POD_NAME" => &mut self.pod_name,
            "POD_NAMESPACE" => &mut self.pod_namespace,
            _ => return None,
        })
    }

    /// The job the process is part of, the key `ls --group job` sums by and the exporter's
    /// `job_id` label: `slurm:<job id>`, else `torchrun:<rendezvous id>` (torchrun's default id
    /// `none` names no job), else `pod:<namespace>/<name>`; `None` outside all three.
    pub fn job_id(&self) -> Option<String> {
        if let Some(id) = &self.slurm_job_id {
            return Some(format!("slurm:{id}"));
        }
        if let Some(id) = self.torchelastic_run_id.as_ref().filter(|id| *id != "none") {
            return Some(format!("torchrun:{id}"));
        }
        self.pod_name.as_ref().map(|pod| {
            format!(
                "pod:{}/{pod}",
                self.pod_namespace.as_deref().unwrap_or("default")
            )
        })
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
        words.join(" ")
    }

    /// The segment text: `VARIABLE=value` lines; an entry that would not fit is left out whole.
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

impl Segment {
    /// Records where the process belongs (the hook does this once, before publishing the segment).
    pub fn set_job_labels(&self, labels: &JobLabels) {
        write_text(&self.header.job_labels, &labels.to_text());
    }

    /// Where the process belongs, as its hook recorded it.
    pub fn job_labels(&self) -> JobLabels {
        JobLabels::from_text(&read_text(&self.header.job_labels))
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
        seg.set_job_labels(&labels);
        assert_eq!(seg.job_labels(), labels);
    }

    #[test]
    fn hostile_segment_text_yields_only_clean_known_labels() {
        let seg = zeroed();
        write_text(
            &seg.header.job_labels,
            "RANK=1\u{1b}[2J\nEVIL=x\nPOD_NAME=a\"b\\c\r\n=\nWORLD_SIZE\nSLURM_JOB_ID=\u{7}\n",
        );
        let labels = seg.job_labels();
        assert_eq!(labels.rank.as_deref(), Some("1[2J"));
        assert_eq!(labels.pod_name.as_deref(), Some("a\"b\\c"));
        assert_eq!(labels.world_size, None);
        assert_eq!(labels.slurm_job_id, None);
        assert_eq!(labels.pairs().count(), 2);
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

#!/bin/sh
# Slurm TaskProlog: puts gpumemhook under every task of every job on this node.
#
# slurm.conf (on every node, then `scontrol reconfigure`):
#   TaskProlog=/etc/slurm/gpumemhook-task-prolog.sh
#
# slurmstepd runs this as the job's user before each task and applies the `export NAME=value` lines
# it prints to the task's environment. The task already has SLURM_JOB_ID and SLURM_PROCID (and, under
# torchrun, RANK, LOCAL_RANK, WORLD_SIZE), which the hook records as job labels: the exporter's
# series and `gpumemhook ls --by-job` then say which job and rank each process is.
#
# The library path is where the node's gpumemhook is installed, e.g. the output of
#   python3 -c 'import gpumemhook; print(gpumemhook.library_path())'
# copied to a fixed place. A job opts out with `export GPUMEMHOOK_DISABLE=1` (the hook stays loaded
# but counts nothing and passes every call through).
lib=/opt/gpumemhook/libgpumemhook.so
[ -r "$lib" ] || exit 0

case ":${LD_PRELOAD:-}:" in
*":$lib:"*) ;;                                   # already there (a nested srun)
*) echo "export LD_PRELOAD=$lib${LD_PRELOAD:+:$LD_PRELOAD}" ;;
esac
# Segments in the node's /dev/shm (the default), where the exporter looks.
echo "unset GPUMEMHOOK_SHM_DIR"
exit 0

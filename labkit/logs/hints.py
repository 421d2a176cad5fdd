"""The hint each failure kind carries: what to change, named (failures.py attaches them)."""

from __future__ import annotations

HINTS = {
    "gpu_oom": "GPU memory ran out: lower micro_batch_size, set recompute_granularity='selective' "
               "(or 'full'), use_distributed_optimizer=True, or raise tensor/pipeline parallel size; "
               "check the estimate first with `labkit plan CONFIG.json`.",
    "host_oom": "host (CPU) memory ran out: lower micro_batch_size or raise memory_limit_gb (CPU runs), "
                "request more memory from Slurm (--mem), or use fewer processes per node.",
    "cpu_alloc": "the CPU allocator hit the per-process cap: lower micro_batch_size or raise "
                 "memory_limit_gb.",
    "nccl_timeout": "a collective waited past its timeout: another rank crashed, hung or is far slower "
                    "- look at the earliest failure of the other ranks; then check the network "
                    "(NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) or raise the process "
                    "group timeout.",
    "cuda_error": "a CUDA error: rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; if it repeats "
                  "on one node, exclude it (sbatch --exclude=NODE) and tell the admins.",
    "ecc": "uncorrectable ECC error: a hardware fault. Exclude the node (sbatch --exclude=NODE), "
           "report it to the cluster admins, and resume from the last checkpoint.",
    "gpu_lost": "the driver lost a GPU (fallen off the bus: power, PCIe or the board): a hardware fault, "
                "not the program. Exclude the node (sbatch --exclude=NODE), report it to the cluster "
                "admins, and resume from the last checkpoint.",
    "time_limit": "the job reached its Slurm time limit: raise --time, lower train_iters, or set "
                  "save_interval and resubmit with resume=True to continue from the checkpoint.",
    "preempted": "a higher-priority job preempted this one: resubmit with resume=True (set "
                 "save_interval so little is lost) or use a non-preemptible partition/QOS.",
    "node_failure": "a node failed under the job: resubmit excluding it (sbatch --exclude=NODE) with "
                    "resume=True, and tell the admins.",
    "task_failure": "Slurm ended the step because one of its tasks failed (srun --kill-on-bad-exit): the "
                    "cause is that task's own error, earlier in the log or in its rank's output.",
    "child_failed": "torchrun stopped because a worker failed: the root cause is that worker's own error "
                    "(listed before this one); rank and exit code are in the message.",
    "python_exception": "a Python exception ended the worker: read the message and the traceback at the "
                        "given line.",
    "comm_exception": "a communication error, usually a consequence: another rank died first - look at "
                      "its failure.",
    "stopping_exception": "raised while a signal stopped the process (a cancel, a time limit, a "
                          "preemption, or its launcher stopping its workers): a consequence - the "
                          "signal's sender is the cause.",
    "cancelled": "the job was cancelled (scancel or a user/admin action); resubmit if unintended.",
    "hang": "no new iteration for longer than the hang timeout: a rank is stuck (deadlock, mismatched "
            "collectives, dead peer). Cancel the job, rerun with NCCL_DEBUG=INFO and "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL, and compare the last line of every rank.",
    "watchdog_stuck": "ProcessGroupNCCL's watchdog was stuck (its heartbeat monitor ended the process): a "
                      "NCCL or CUDA call hangs on this rank - a dead peer, a GPU fault or a deadlock; run "
                      "with NCCL_DEBUG=INFO and TORCH_NCCL_DUMP_ON_TIMEOUT=1 and compare every rank's last "
                      "collective (a longer TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only waits longer).",
    "disk_full": "the disk holding the run or its checkpoints is full (ENOSPC): free space there "
                 "(`df -h DIR`; `labkit clean` removes your finished runs' checkpoints) or save "
                 "to a bigger disk (--save DIR, or another run_root), then resume from the last "
                 "complete checkpoint (`labkit submit CONFIG --resume`).",
    "shm": "shared memory (/dev/shm, a tmpfs in RAM) is full, not a disk: a container's is 64 MB unless "
           "raised - run it with docker's --shm-size=16g or --ipc=host (a Kubernetes pod: a memory-backed "
           "emptyDir on /dev/shm), or use fewer DataLoader workers.",
    "bad_checkpoint": "the checkpoint being loaded is truncated or corrupt (a save cut short by a "
                      "full disk or a kill): write the previous complete iteration (the message "
                      "names it) into latest_checkpointed_iteration.txt and resume, or start over "
                      "(--no-resume, `labkit submit CONFIG --overwrite`).",
    "sigkill": "a worker was killed with SIGKILL (exit -9 / 137) and nothing else explains it: most "
               "often the kernel's OOM killer - lower micro_batch_size or request more memory.",
}

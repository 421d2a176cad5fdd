#!/bin/bash
# labkit sbatch script for run gpt2_tp2
# 2 node(s) x 8 GPU(s) = world size 16 | TP=2 x PP=1 x DP=8 | cuda
# Rendered by labkit from config.json and the cluster profile 'apptainer'; submit it with
# `sbatch job.sh` (or labkit's submit). To change the run, change the RunConfig, not this file.
#
# ---- Parameters: what Slurm allocates (one task per node; torchrun starts the processes) ----
#SBATCH --job-name=labkit-student-gpt2_tp2
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=8
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR1@120
#SBATCH --output=/shared/labkit/runs/demo/log.txt
#SBATCH --open-mode=append

# ---- Setup: where things are and what the job needs ------------------------------------------
set -uo pipefail   # no -e: the exit code must still reach $RUN_DIR/exit_code at the end
export RUN_DIR=/shared/labkit/runs/demo
export PROGRAM=/shared/labkit/code/pretrain_gpt.py
export TORCHRUN=torchrun
cd "$RUN_DIR"
module load apptainer
export CONTAINER_IMAGE=/shared/images/pytorch.sif
export CONTAINER_BINDS='--bind /shared'
export LABKIT_LOG_CAPTURED=1   # this script already sends stdout/stderr to log.txt
export NCCL_DEBUG=INFO

# ---- The run as Megatron-LM flags (pretrain_gpt.py: labkit's or Megatron-LM's) ----------------
# labkit's own fields without a Megatron-LM flag (name, nodes, device, memory cap, ...) are in
# config.json, named here in the environment: Megatron-LM refuses flags it does not know.
export LABKIT_CONFIG="$RUN_DIR/config.json"
# labkit's data folder (`make data`): the corpus and tokenizer of a run without data_path.
DATA_DIR=/shared/labkit/data
PARALLELISM_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 1
)
MODEL_ARGS=(
    --num-layers 12
    --hidden-size 768
    --num-attention-heads 12
    --attention-backend flash
    --seq-length 1024
    --max-position-embeddings 1024
    --vocab-size 50257
    --make-vocab-size-divisible-by 128
    --hidden-dropout 0.0
    --attention-dropout 0.0
    --init-method-std 0.02
    --position-embedding-type learned_absolute
)
BATCH_ARGS=(
    --micro-batch-size 4
    --global-batch-size 64
)
TRAINING_ARGS=(
    --train-iters 100
    --lr 0.0006
    --min-lr 6e-05
    --lr-warmup-iters 10
    --weight-decay 0.01
    --clip-grad 1.0
    --seed 1234
    --bf16
    --lr-decay-style cosine
    --adam-beta1 0.9
    --adam-beta2 0.95
)
DATA_ARGS=(
    --data-path "$DATA_DIR"/corpus_text_document
    --tokenizer-type GPT2BPETokenizer
    --vocab-file "$DATA_DIR"/tokenizer/vocab.json
    --merge-file "$DATA_DIR"/tokenizer/merges.txt
    --split 98,2,0
)
LOGGING_ARGS=(
    --log-interval 10
    --eval-iters 2
    --save "$RUN_DIR/checkpoints"
    --load "$RUN_DIR/checkpoints"
)
MEGATRON_ARGS=("${PARALLELISM_ARGS[@]}" "${MODEL_ARGS[@]}" "${BATCH_ARGS[@]}"
               "${TRAINING_ARGS[@]}" "${DATA_ARGS[@]}" "${LOGGING_ARGS[@]}")

# ---- Warning signal: Slurm's SIGUSR1 before the time limit or a preemption (--signal=B:USR1@S)
# reaches this script only; it passes it on to every training process (scancel --signal: all
# steps, on every node), which save a checkpoint at the next iteration and stop (exit code 75).
# torchrun itself ignores it (trap "" below), or it would die of it. A job Slurm requeued (node
# failure, preemption, `scontrol requeue`) runs this script again: one attempt each, this log appended.
ATTEMPT=$((${SLURM_RESTART_COUNT:-0} + 1))
echo "[job] attempt $ATTEMPT of job $SLURM_JOB_ID starts $(date '+%F %T') on $SLURM_JOB_NODELIST"
# A preemption moves the job's end to now + the partition's GraceTime; a time limit does not.
job_end() { scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'EndTime=[^ ]*'; }
END_AT_START=$(job_end)
forward_warning() {
  local why="the time limit is near ($END_AT_START)" end_now
  end_now=$(job_end)
  if [ -n "$end_now" ] && [ "$end_now" != "$END_AT_START" ]; then
    why="the job is being preempted ($end_now)"
  fi
  echo "[job] SIGUSR1 from Slurm at $(date '+%F %T'): $why; asking the training to save and stop"
  scancel --signal=USR1 "$SLURM_JOB_ID"
}
trap forward_warning USR1

# The head node (node rank 0) hosts torchrun's rendezvous. The port comes from the job id,
# so two jobs that share a node never fight over one fixed port.
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
echo "[job] $SLURM_JOB_ID on $SLURM_JOB_NODELIST: rendezvous at $MASTER_ADDR:$MASTER_PORT"

# ---- Command: one torchrun agent per node, 8 processes each ---------------------------------
# Single quotes: $SLURM_NODEID must expand on each node, not here on the head node. The
# program's arguments follow the quoted command and reach it as "$@". In the background with
# `wait`: bash runs a trap only between commands, and `wait` is one it interrupts.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'trap "" USR1; exec apptainer exec --nv $CONTAINER_BINDS "$CONTAINER_IMAGE" "$TORCHRUN" \
    --nnodes "$SLURM_NNODES" --node_rank "$SLURM_NODEID" --nproc_per_node 8 \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    "$PROGRAM" "$@"' program "${MEGATRON_ARGS[@]}" &
srun_pid=$!
wait "$srun_pid"
rc=$?
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; rc=$?; done  # a trap ended the wait
if [ "$rc" -ne 0 ] && [ "$(cat "$RUN_DIR/exit_code" 2>/dev/null)" = 75 ]; then
  rc=75   # the training saved a checkpoint on the warning signal and stopped
fi
echo "$rc" > "$RUN_DIR/exit_code"   # the final state never depends on Slurm accounting
echo "[job] attempt $ATTEMPT of job $SLURM_JOB_ID ends $(date '+%F %T'): exit code $rc"
if [ "$rc" -eq 75 ] && scontrol show job "$SLURM_JOB_ID" | grep -q ' Requeue=1'; then
  echo "[job] requeueing job $SLURM_JOB_ID (--requeue): its next attempt resumes from that checkpoint"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"

#!/bin/bash
# labkit local launch script for run tp2pp2
# 2 node(s) x 2 process(es) = world size 4 | TP=2 x PP=2 x DP=1 | cpu
# Rendered by labkit from config.json for the local backend: every "node" is one torchrun
# agent on this machine, and they meet at 127.0.0.1 the way real nodes meet at the head node.
# labkit runs this script in its own process group with stdout/stderr going to log.txt, so
# cancelling kills exactly this group. By hand: MASTER_PORT=29500 bash job.sh > log.txt 2>&1
set -uo pipefail   # no -e: the exit code must still reach $RUN_DIR/exit_code at the end
export RUN_DIR=/shared/labkit/runs/demo
export PROGRAM=/opt/labkit/code/pretrain_gpt.py
export TORCHRUN=torchrun
cd "$RUN_DIR"
export LABKIT_LOG_CAPTURED=1   # stdout/stderr already go to log.txt
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1

# ---- The run as Megatron-LM flags (pretrain_gpt.py: labkit's or Megatron-LM's) ----------------
# labkit's own fields without a Megatron-LM flag (name, nodes, device, memory cap, ...) are in
# config.json, named here in the environment: Megatron-LM refuses flags it does not know.
export LABKIT_CONFIG="$RUN_DIR/config.json"
# labkit's data folder (`make data`): the corpus and tokenizer of a run without data_path.
DATA_DIR=/opt/labkit/data
PARALLELISM_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
)
MODEL_ARGS=(
    --num-layers 4
    --hidden-size 128
    --num-attention-heads 4
    --attention-backend unfused
    --seq-length 128
    --max-position-embeddings 128
    --vocab-size 4096
    --make-vocab-size-divisible-by 128
    --hidden-dropout 0.0
    --attention-dropout 0.0
    --init-method-std 0.02
    --position-embedding-type learned_absolute
)
BATCH_ARGS=(
    --micro-batch-size 2
    --global-batch-size 8
)
TRAINING_ARGS=(
    --train-iters 30
    --lr 0.001
    --min-lr 0.0001
    --lr-warmup-iters 3
    --weight-decay 0.01
    --clip-grad 1.0
    --seed 1234
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
    --log-interval 1
    --eval-iters 2
    --save "$RUN_DIR/checkpoints"
    --load "$RUN_DIR/checkpoints"
)
MEGATRON_ARGS=("${PARALLELISM_ARGS[@]}" "${MODEL_ARGS[@]}" "${BATCH_ARGS[@]}"
               "${TRAINING_ARGS[@]}" "${DATA_ARGS[@]}" "${LOGGING_ARGS[@]}")
export MASTER_ADDR=127.0.0.1
export MASTER_PORT=${MASTER_PORT:-29500}   # labkit passes a free port
NNODES=2

pids=()
for node_rank in $(seq 0 $((NNODES - 1))); do
  "$TORCHRUN" --nnodes "$NNODES" --node_rank "$node_rank" --nproc_per_node 2 \
      --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
      "$PROGRAM" "${MEGATRON_ARGS[@]}" &
  pids+=("$!")
done

# Wait for every node; the first one to fail stops the others (as srun --kill-on-bad-exit).
rc=0
for _ in "${pids[@]}"; do
  wait -n
  s=$?
  if [ "$s" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$s; kill "${pids[@]}" 2>/dev/null; fi
done
echo "$rc" > "$RUN_DIR/exit_code"
exit "$rc"

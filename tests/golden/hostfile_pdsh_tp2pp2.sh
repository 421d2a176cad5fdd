#!/bin/bash
# labkit pdsh launch script for run tp2pp2
# 2 node(s) x 2 process(es) = world size 4 | TP=2 x PP=2 x DP=1 | cpu | hosts node1,node2
# Rendered by labkit for the hostfile backend, launcher pdsh, from the cluster profile:
# 'lab-hosts'.
# Started on the login host, this script runs itself on every host of the hostfile with
# `pdsh -R ssh` (pdsh puts each host's rank where %n stands and prefixes its lines with
# `host: `); on each host it starts one torchrun agent. The run directory must be on a file
# system every host sees. By hand: bash job.sh >> log.txt 2>&1
set -uo pipefail   # no -e: the exit code must still reach $RUN_DIR/exit_code at the end
export RUN_DIR=/shared/runs/tp2pp2
export PROGRAM=/opt/labkit/code/pretrain_gpt.py
export TORCHRUN=/opt/venv/bin/torchrun
cd "$RUN_DIR"
# (no modules or setup lines in the profile)
export LABKIT_LOG_CAPTURED=1   # stdout/stderr already go to log.txt
export GLOO_SOCKET_IFNAME=eth0
export OMP_NUM_THREADS=1
HOSTS=node1,node2
NNODES=2
export MASTER_ADDR=10.0.0.11   # the head: the first host of the hostfile

if [ "${1:-}" = node ]; then
  # ---- On each host: one torchrun agent, 2 processes ------------------------------------
  export MASTER_PORT="$3"
  "$TORCHRUN" --nnodes "$NNODES" --node_rank "$2" --nproc_per_node 2 \
      --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
      "$PROGRAM" --config "$RUN_DIR/config.json"
  rc=$?
  echo "$rc" > "$RUN_DIR/hosts/$2.exit"
  exit "$rc"
fi

# ---- On the login host: the same script on every host, node rank = pdsh's %n -------------------
export MASTER_PORT=${MASTER_PORT:-29500}
TOKEN=${LABKIT_JOB_TOKEN:-manual$$}   # marks the job's processes on every host (labkit cancel)
mkdir -p "$RUN_DIR/hosts" && rm -f "$RUN_DIR"/hosts/*.exit "$RUN_DIR/hosts/lost"
echo "[job] pdsh -R ssh -w $HOSTS: rendezvous at $MASTER_ADDR:$MASTER_PORT"
pdsh -S -R ssh -w "$HOSTS" "LABKIT_JOB_TOKEN=$TOKEN bash $(printf %q "$RUN_DIR/job.sh") node %n $MASTER_PORT"
rc=$?
# A host that ssh no longer reaches is lost: name it in the log and in hosts/lost.
if [ "$rc" -ne 0 ]; then
  for h in ${HOSTS//,/ }; do
    if ! ssh -o BatchMode=yes -o ConnectTimeout=5 "$h" true 2>/dev/null; then
      echo "$h" >> "$RUN_DIR/hosts/lost"
      echo "[labkit] host $h is lost: \`ssh $h true\` fails; check the host, then labkit doctor"
    fi
  done
fi
echo "$rc" > "$RUN_DIR/exit_code"
exit "$rc"

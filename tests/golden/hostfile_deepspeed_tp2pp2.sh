#!/bin/bash
# labkit deepspeed launch script for run tp2pp2
# 2 node(s) x 2 process(es) = world size 4 | TP=2 x PP=2 x DP=1 | cpu | hosts node1,node2
# Rendered by labkit for the hostfile backend, launcher deepspeed, from the cluster profile:
# 'lab-hosts'. The DeepSpeed launcher reads the hostfile, reaches every host with pdsh
# over ssh and starts its launch.py there, which starts 2 processes with RANK, LOCAL_RANK,
# WORLD_SIZE, MASTER_ADDR and MASTER_PORT set and --local_rank on the command line. Only the
# variables listed in .deepspeed_env (written below, in the directory it starts in) reach the
# hosts. The run directory must be on a file system every host sees.
set -uo pipefail   # no -e: the exit code must still reach $RUN_DIR/exit_code at the end
export RUN_DIR=/shared/runs/tp2pp2
export PROGRAM=/opt/labkit/code/pretrain_gpt.py
export DEEPSPEED=/opt/venv/bin/deepspeed
cd "$RUN_DIR"
# (no modules or setup lines in the profile)
export LABKIT_LOG_CAPTURED=1   # stdout/stderr already go to log.txt
export GLOO_SOCKET_IFNAME=eth0
export OMP_NUM_THREADS=1
HOSTS=node1,node2
export MASTER_ADDR=10.0.0.11   # the head: the first host of the hostfile
export MASTER_PORT=${MASTER_PORT:-29500}
TOKEN=${LABKIT_JOB_TOKEN:-manual$$}   # marks the job's processes on every host (labkit cancel)
mkdir -p "$RUN_DIR/hosts" && rm -f "$RUN_DIR/hosts/lost"
{ for v in LABKIT_LOG_CAPTURED GLOO_SOCKET_IFNAME OMP_NUM_THREADS; do echo "$v=${!v}"; done
  echo "LABKIT_JOB_TOKEN=$TOKEN"; } > "$RUN_DIR/.deepspeed_env"
echo "[job] deepspeed --hostfile hostfile on $HOSTS: rendezvous at $MASTER_ADDR:$MASTER_PORT"
"$DEEPSPEED" --hostfile "$RUN_DIR/hostfile" --launcher pdsh --num_nodes 2 \
    --num_gpus 2 --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    "$PROGRAM" --config "$RUN_DIR/config.json"
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

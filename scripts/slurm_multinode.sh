#!/usr/bin/env bash
# Hybrid-parallel ctrkit training across SLURM nodes: one torchrun per node, each starting one
# process per GPU (or N CPU processes), meeting at the first node's rendezvous endpoint.
#
#   sbatch --nodes 4 scripts/slurm_multinode.sh --dataset /data/criteo --model dlrm --epochs 1 \
#       --save-checkpoint /shared/runs/dlrm.pt
#
# Everything after the script name is passed to `ctrkit train`. Environment knobs:
#   PROCS_PER_NODE  processes per node (default: the node's GPU count, or 1 without GPUs)
#   RDZV_PORT       rendezvous port on the first node (default 29500)
#   CTRKIT_PYTHON   the Python with ctrkit installed (default: python3)
#SBATCH --job-name=ctrkit-train
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --output=ctrkit-%j.out
set -euo pipefail

PYTHON=${CTRKIT_PYTHON:-python3}
if [ -z "${PROCS_PER_NODE:-}" ]; then
    PROCS_PER_NODE=$(nvidia-smi -L 2>/dev/null | wc -l || true)
    [ "${PROCS_PER_NODE:-0}" -gt 0 ] || PROCS_PER_NODE=1
fi
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
RDZV_PORT=${RDZV_PORT:-29500}
echo "ctrkit: ${SLURM_JOB_NUM_NODES} nodes x ${PROCS_PER_NODE} processes, rendezvous ${HEAD_NODE}:${RDZV_PORT}"

# srun starts one torchrun per node; torchrun numbers the ranks and restarts nothing (a failed rank
# ends the job, and ctrkit's --dist-timeout bounds how long the others wait).
srun --kill-on-bad-exit=1 "$PYTHON" -m torch.distributed.run \
    --nnodes "$SLURM_JOB_NUM_NODES" \
    --nproc-per-node "$PROCS_PER_NODE" \
    --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-backend c10d \
    --rdzv-endpoint "${HEAD_NODE}:${RDZV_PORT}" \
    -m ctrkit train "$@"

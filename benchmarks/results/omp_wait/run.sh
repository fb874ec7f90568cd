#!/usr/bin/env bash
# How OpenMP's wait policy moves a training step on this machine (issue 16): the cost of one parallel
# region (wake.py), then DLRM at the Criteo-Kaggle shape with SGD, fp32 and bf16, under
# OMP_WAIT_POLICY=PASSIVE (the benchmarks' setting), PASSIVE with a bounded spin (GOMP_SPINCOUNT) and
# libgomp's default (spin ~3 ms, then sleep), each alone and as two copies at once (a competing process),
# and PASSIVE at 1 thread. ROUNDS interleaved rounds (default 2). Output: results.txt beside this script.
# Usage: bash benchmarks/results/omp_wait/run.sh   (from the repository root, after `make install`)
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=benchmarks/results/omp_wait
ROUNDS=${ROUNDS:-2}
bench() {  # label, env..., -- , ctrkit bench train flags...
  local label=$1; shift
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "${envs[@]}" .venv/bin/ctrkit bench train --model dlrm --steps 30 \
    --repeats 3 --optimizer sgd --embedding-optimizer sgd "$@" 2>&1 | grep -o "[0-9,]* samples/s" | sed "s/^/$label: /"
}
{
  .venv/bin/python -c "from ctrkit.bench.peak import machine; print(machine())"
  for pol in "OMP_WAIT_POLICY=PASSIVE" "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=3000" "X=default"; do
    for th in 1 2; do echo "[$pol]"; env -u OMP_WAIT_POLICY $pol .venv/bin/python $here/wake.py $th; done
  done
  for round in $(seq "$ROUNDS"); do
    for prec in fp32 bf16; do
      amp=(); [ $prec = bf16 ] && amp=(--amp)
      for spin in passive spin3000 default; do
        case $spin in
          passive) e=(OMP_WAIT_POLICY=PASSIVE) ;;
          spin3000) e=(OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=3000) ;;
          default) e=(X=default) ;;
        esac
        bench "round $round $prec $spin alone" "${e[@]}" -- --threads 2 "${amp[@]}"
        bench "round $round $prec $spin pair A" "${e[@]}" -- --threads 2 "${amp[@]}" &
        bench "round $round $prec $spin pair B" "${e[@]}" -- --threads 2 "${amp[@]}"
        wait
      done
      bench "round $round $prec passive 1 thread" OMP_WAIT_POLICY=PASSIVE -- --threads 1 "${amp[@]}"
    done
  done
} | tee $here/results.txt

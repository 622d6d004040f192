#!/usr/bin/env bash
# One GPU session, about 6 minutes: what only a CUDA machine can check. Results under $OUT.
#   bash tests/bench/gpu_session.sh            (on a GPU machine, from the repo root; kubeddp
#   installed there with pip install --no-deps --no-build-isolation -e .)
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { log "install failed"; tail "$OUT/install.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import torch;print('torch',torch.__version__,'cuda',torch.version.cuda,'nccl',torch.cuda.nccl.version())" | tee -a "$OUT/summary.txt"

log "1. CUDA unit tests (no host sync, stop vote, versions, anything marked for CUDA)"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/unit/test_no_host_sync.py tests/unit/test_stop_vote.py tests/unit/test_versions.py -k "cuda or gpu or nccl" 2>&1 | tail -15 | tee -a "$OUT/summary.txt"

log "2. fp16 + bf16 short runs (1 GPU, NCCL)"
for amp in bf16 fp16; do
  timeout 120 kubeddp train --nproc 1 --set train.amp=$amp --set train.max_steps=60 \
    --set checkpoint.dir=/tmp/ck-$amp --set checkpoint.resume=never --set metrics.enabled=false \
    >"$OUT/run-$amp.log" 2>&1; echo "amp=$amp exit=$?" | tee -a "$OUT/summary.txt"
  grep -E "^done:|error" "$OUT/run-$amp.log" | tail -2 | tee -a "$OUT/summary.txt"
done

log "3. SIGTERM mid-run -> 143, resume from the checkpoint; /metrics scraped during the run"
rm -rf /tmp/ck-term
timeout 150 kubeddp train --nproc 1 --set train.epochs=50 --set train.max_steps=6000 \
  --set checkpoint.dir=/tmp/ck-term --set checkpoint.resume=never --set metrics.port=9911 >"$OUT/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 90); do grep -q "first step" "$OUT/term.log" 2>/dev/null && break; sleep 1; done
sleep 8
curl -s localhost:9911/metrics >"$OUT/metrics.txt"; echo "metrics lines: $(grep -c '^kubeddp_' "$OUT/metrics.txt")" | tee -a "$OUT/summary.txt"
kill -TERM $pid; wait $pid; echo "SIGTERM exit=$?" | tee -a "$OUT/summary.txt"
find /tmp/ck-term -maxdepth 1 | tee -a "$OUT/summary.txt"
timeout 150 kubeddp train --nproc 1 --set train.epochs=50 --set train.max_steps=6000 --set checkpoint.dir=/tmp/ck-term \
  --set checkpoint.resume=auto --set metrics.enabled=false >"$OUT/resume.log" 2>&1
echo "resume exit=$?" | tee -a "$OUT/summary.txt"; grep -iE "resum|^done:" "$OUT/resume.log" | head -3 | tee -a "$OUT/summary.txt"

log "4. diagnostics on CUDA (NCCL, one rank): a stalled data loader -> report + 203; NaN -> stop 6 / skip 0"
fault() { python3 -c "from tests.helpers.faults import settings; print('\\n'.join(settings('$1', 0, $2, batch_size=16)))"; }
for case in "sleep_data 8 stop 203" "nan 6 stop 6" "nan 6 skip 0"; do
  read -r name step action want <<<"$case"
  set -- "$name" "$step" "$action" "$want"
  mapfile -t args < <(fault "$1" "$2")
  timeout 120 kubeddp train --nproc 1 "${args[@]}" --set train.batch_size=16 --set train.max_steps=40 \
    --set "checkpoint.dir=/tmp/ck-diag-$1-$3" --set checkpoint.resume=never --set metrics.enabled=false \
    --set diagnostics.stall_seconds=5 --set diagnostics.on_stall=exit --set "diagnostics.on_nonfinite=$3" \
    >"$OUT/diag-$1-$3.log" 2>&1
  echo "fault=$1 action=$3 exit=$? (want $4)" | tee -a "$OUT/summary.txt"
  grep -E "stall:|non-finite|flight|^done:" "$OUT/diag-$1-$3.log" | head -3 | cut -c1-300 | tee -a "$OUT/summary.txt"
done

log "5. a tutorial-style mp.spawn script on one GPU (NCCL), through kubeddp"
timeout 120 kubeddp train --script tests/tutorial_scripts/spawn_multigpu.py -- 4 2 --world-size 1 --snapshot /tmp/spawn.pt \
  >"$OUT/spawn.log" 2>&1; echo "spawn exit=$?" | tee -a "$OUT/summary.txt"; tail -3 "$OUT/spawn.log" | tee -a "$OUT/summary.txt"

log "6. network: the transport NCCL chose (its INFO log, read by kubeddp), the network check alone, the comm hooks"
timeout 120 kubeddp train --nproc 1 --set network.check=only --set metrics.enabled=false \
  >"$OUT/netcheck.log" 2>&1; echo "network.check=only exit=$?" | tee -a "$OUT/summary.txt"
grep -E "NCCL transport|network check|warning: NCCL" "$OUT/netcheck.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
cat /tmp/kubeddp-nccl-*/nccl.log 2>/dev/null | grep -E "Using network|NET/IB|NET/Socket|NET/OFI|NET/Plugin|via " | head -12 >"$OUT/nccl-init-lines.txt"
echo "NCCL's own init lines (the formats tests/unit/nccl_logs/ are written in):" | tee -a "$OUT/summary.txt"
tee -a "$OUT/summary.txt" <"$OUT/nccl-init-lines.txt"
for hook in bf16 powersgd; do
  timeout 120 kubeddp train --nproc 1 --set ddp.comm_hook=$hook --set ddp.powersgd_start_step=10 \
    --set train.max_steps=40 --set checkpoint.dir=/tmp/ck-hook-$hook --set checkpoint.resume=never \
    --set metrics.enabled=false >"$OUT/hook-$hook.log" 2>&1
  echo "comm_hook=$hook exit=$?" | tee -a "$OUT/summary.txt"
  grep -E "NCCL transport|^done:|kubeddp: error" "$OUT/hook-$hook.log" | tail -2 | cut -c1-400 | tee -a "$OUT/summary.txt"
done

if [ "${GPU_BENCH:-1}" = 1 ]; then  # GPU_BENCH=0: the checks only (about 3 minutes)
  log "7. GPU bench (kubeddp vs hand-written loop, bf16/fp32, compile, MFU)"
  timeout 240 python3 -m tests.bench.gpu --budget "${GPU_BUDGET:-150}" --out "$OUT/gpu.json" >"$OUT/bench.log" 2>&1
  echo "bench exit=$?" | tee -a "$OUT/summary.txt"; tail -30 "$OUT/bench.log" | tee -a "$OUT/summary.txt"
fi
log "done"

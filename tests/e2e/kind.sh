#!/usr/bin/env bash
# End-to-end on a real Kubernetes (kind): the CPU image, the operators, gloo jobs to Succeeded.
#
#   tests/e2e/kind.sh training-operator   # Training Operator v1.9: PyTorchJob from k8s/,
#                                         # the Helm chart (ci values), an elastic PyTorchJob
#   tests/e2e/kind.sh trainer             # Kubeflow Trainer v2.3 (Helm chart) + JobSet: TrainJob
#   tests/e2e/kind.sh indexedjob          # no operator: a batch/v1 Indexed Job
#
# Needs docker, kind, kubectl, helm and kubeddp (the repo's .venv, or KUBEDDP=...) on PATH.
# Environment: KIND_CLUSTER (default kubeddp-e2e), KIND_NODE_IMAGE, KEEP_CLUSTER=1 (do not
# delete a cluster this script created), SKIP_BUILD=1 (kubeddp:cpu is already built),
# JOB_TIMEOUT (seconds per job, default 600).
# Every job must reach Succeeded/Complete; rank 0's log must show the expected world size and a
# final loss below the first; while the elastic job trains, its /metrics must report
# kubeddp_world_size, then one of its pods is deleted and must be recreated.
# On any failure: pods, events, descriptions and logs are printed.
set -euo pipefail
cd "$(dirname "$0")/../.."

LEG="${1:?usage: tests/e2e/kind.sh training-operator|trainer|indexedjob}"
CLUSTER="${KIND_CLUSTER:-kubeddp-e2e}"
# kind v0.25.0's image for Kubernetes 1.31 (tag and digest from the kind release notes).
NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.31.2@sha256:18fbefc20a7113353c7b75b5c869d7145a6abd6269154825872dc59c1329912e}"
TRAINING_OPERATOR_REF="v1.9.4"
TRAINER_REF="v2.3.0"
KUSTOMIZE_BASE="github.com/kubeflow/trainer.git/manifests/overlays"
IMAGE="kubeddp:cpu"
JOB_TIMEOUT="${JOB_TIMEOUT:-600}"
KUBEDDP="${KUBEDDP:-$(command -v kubeddp || echo .venv/bin/kubeddp)}"
# A short gloo regression run: enough steps to watch /metrics while it trains.
TRAIN_ARGS=(
  --set workload.name=regression --set train.max_steps=300 --set train.epochs=20
  --set train.log_every=20 --set checkpoint.every_steps=50
  --set ddp.backend=gloo --set ddp.device=cpu
)
CPU_POD=(--image "${IMAGE}" --image-pull-policy IfNotPresent --cpu 250m --memory 512Mi
  --memory-limit 1Gi --shm-size 256Mi)
created_cluster=0
cluster_ready=0

log() { printf '\n=== %s\n' "$*" >&2; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

dump() {
  log "diagnostics"
  kubectl get pods -A -o wide || true
  kubectl get events -A --sort-by=.lastTimestamp | tail -n 80 || true
  kubectl get pytorchjobs,trainjobs,jobsets,jobs -A -o yaml 2> /dev/null | tail -n 200 || true
  kubectl describe pods -n default || true
  local pod
  for pod in $(kubectl get pods -n default -o name 2> /dev/null); do
    log "logs ${pod}"
    kubectl logs -n default "${pod}" --all-containers --tail=200 || true
    kubectl logs -n default "${pod}" --all-containers --previous --tail=100 2> /dev/null || true
  done
  local ns deploy
  for ns in kubeflow kubeflow-system; do
    for deploy in $(kubectl get deployments -n "${ns}" -o name 2> /dev/null); do
      log "logs ${ns}/${deploy}"
      kubectl logs -n "${ns}" "${deploy}" --all-containers --tail=100 || true
    done
  done
}

on_exit() {
  local code=$?
  if [ "${code}" -ne 0 ] && [ "${cluster_ready}" = 1 ]; then
    dump
  fi
  if [ "${created_cluster}" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    kind delete cluster --name "${CLUSTER}" || true
  fi
  exit "${code}"
}
trap on_exit EXIT

cluster_up() {
  if kind get clusters 2> /dev/null | grep -qx "${CLUSTER}"; then
    log "using the existing kind cluster ${CLUSTER}"
  else
    log "kind create cluster ${CLUSTER} (${NODE_IMAGE})"
    kind create cluster --name "${CLUSTER}" --image "${NODE_IMAGE}" --wait 180s
    created_cluster=1
  fi
  kubectl config use-context "kind-${CLUSTER}"
  cluster_ready=1
}

image_up() {
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "docker build ${IMAGE}"
    docker build --build-arg VARIANT=cpu -t "${IMAGE}" .
  fi
  kind load docker-image "${IMAGE}" --name "${CLUSTER}"
}

# Retry a command until it succeeds (webhooks answer some seconds after the pods are Ready).
retry() {
  local seconds="$1"
  shift
  local end=$((SECONDS + seconds))
  until "$@"; do
    [ "${SECONDS}" -lt "${end}" ] || fail "still failing after ${seconds}s: $*"
    sleep 5
  done
}

install_training_operator() {
  log "Kubeflow Training Operator ${TRAINING_OPERATOR_REF}"
  retry 120 kubectl apply --server-side \
    -k "${KUSTOMIZE_BASE}/standalone?ref=${TRAINING_OPERATOR_REF}"
  kubectl -n kubeflow rollout status deployment/training-operator --timeout=300s
  # The validating webhook must answer before a job can be created.
  retry 180 kubectl apply --dry-run=server -f k8s/pytorchjob-cpu-gloo.yaml
}

install_trainer() {
  # The v2.3.0 release installs through its Helm chart (CRDs live in the chart since v2.3);
  # JobSet comes with it, the default runtimes with runtimes.defaultEnabled.
  log "Kubeflow Trainer ${TRAINER_REF} (with JobSet)"
  retry 120 helm upgrade --install kubeflow-trainer oci://ghcr.io/kubeflow/charts/kubeflow-trainer \
    --namespace kubeflow-system --create-namespace --version "${TRAINER_REF#v}" \
    --set runtimes.defaultEnabled=true
  kubectl -n kubeflow-system wait --for=condition=Available deployment --all --timeout=300s
  retry 120 kubectl get clustertrainingruntime torch-distributed
  # The validating webhook must answer before a TrainJob can be created.
  "${KUBEDDP}" render trainjob --name kubeddp-webhook-probe "${CPU_POD[@]}" \
    --validate-against offline > /tmp/kubeddp-webhook-probe.yaml
  retry 180 kubectl apply --dry-run=server -f /tmp/kubeddp-webhook-probe.yaml
}

# wait_job KIND NAME: Succeeded/Complete, or fail fast on Failed.
wait_job() {
  local kind="$1" name="$2" end=$((SECONDS + JOB_TIMEOUT)) conditions
  log "waiting for ${kind}/${name}"
  while :; do
    conditions="$(kubectl get "${kind}" "${name}" \
      -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}' || true)"
    case " ${conditions} " in
      *" Failed "*) fail "${kind}/${name} Failed (${conditions})" ;;
      *" Succeeded "* | *" Complete "*)
        log "${kind}/${name}: ${conditions}"
        return 0
        ;;
    esac
    [ "${SECONDS}" -lt "${end}" ] || fail "${kind}/${name} not done after ${JOB_TIMEOUT}s"
    sleep 5
  done
}

# assert_trained SELECTOR WORLD_SIZE: from the pods' logs (they have finished): rank 0 saw the
# expected world size, and its final loss is below its first.
assert_trained() {
  local selector="$1" world="$2" logs line final start
  logs="$(kubectl logs -l "${selector}" --tail=-1 --prefix --max-log-requests 10)"
  grep -q "| world size ${world} (gloo" <<< "${logs}" \
    || fail "no pod of ${selector} logged 'world size ${world}'"
  line="$(grep -o 'final loss [0-9.]* (start [0-9.]*)' <<< "${logs}" | tail -n 1)"
  [ -n "${line}" ] || fail "no 'final loss' line in the logs of ${selector}"
  read -r final start <<< "$(sed -E 's/final loss ([0-9.]+) \(start ([0-9.]+)\)/\1 \2/' <<< "${line}")"
  awk -v f="${final}" -v s="${start}" 'BEGIN { exit !(f < s) }' \
    || fail "${selector}: loss did not fall (start ${start}, final ${final})"
  log "${selector}: world size ${world}, loss ${start} -> ${final}"
}

# assert_metrics POD WORLD_SIZE: scrape the pod's own /metrics from inside it while it trains.
assert_metrics() {
  local pod="$1" world="$2" end=$((SECONDS + 300)) body value
  log "scraping ${pod}:9400/metrics while it trains"
  while :; do
    body="$(kubectl exec "${pod}" -- python -c \
      'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9400/metrics").read().decode())' \
      2> /dev/null || true)"
    if grep -Eq '^kubeddp_step [1-9]' <<< "${body}"; then
      value="$(awk '$1 == "kubeddp_world_size" { print int($2) }' <<< "${body}")"
      [ "${value}" = "${world}" ] || fail "${pod}: kubeddp_world_size=${value:-absent}, expected ${world}"
      log "${pod}: kubeddp_world_size ${value} while training"
      return 0
    fi
    [ "${SECONDS}" -lt "${end}" ] || fail "${pod}: no kubeddp_step > 0 on /metrics in 300s"
    sleep 2
  done
}

# replace_pod POD: delete a training pod mid-run; the operator must create a new one (new UID)
# and the job must still succeed. A pod that already finished is reported, not deleted.
replace_pod() {
  local pod="$1" uid phase end=$((SECONDS + 300))
  phase="$(kubectl get pod "${pod}" -o jsonpath='{.status.phase}')"
  if [ "${phase}" != Running ]; then
    log "${pod} is ${phase}: the job finished before a pod could be replaced (not exercised)"
    return 0
  fi
  uid="$(kubectl get pod "${pod}" -o jsonpath='{.metadata.uid}')"
  log "deleting ${pod} mid-run"
  kubectl delete pod "${pod}" --wait=false
  until [ "$(kubectl get pod "${pod}" -o jsonpath='{.metadata.uid}' 2> /dev/null)" != "${uid}" ] \
    && kubectl get pod "${pod}" > /dev/null 2>&1; do
    [ "${SECONDS}" -lt "${end}" ] || fail "${pod} was not recreated within 300s"
    sleep 2
  done
  log "${pod} recreated by the operator"
}

render() { "${KUBEDDP}" render "$@" "${CPU_POD[@]}" "${TRAIN_ARGS[@]}"; }

leg_training_operator() {
  install_training_operator

  log "(a) k8s/pytorchjob-cpu-gloo.yaml"
  kubectl apply -f k8s/pytorchjob-cpu-gloo.yaml
  wait_job pytorchjob kubeddp-cpu
  assert_trained training.kubeflow.org/job-name=kubeddp-cpu 2

  log "(b) helm install with charts/kubeddp/ci/cpu-kind-values.yaml"
  helm install ci charts/kubeddp -f charts/kubeddp/ci/cpu-kind-values.yaml
  wait_job pytorchjob kubeddp-ci
  assert_trained training.kubeflow.org/job-name=kubeddp-ci 4
  helm test ci --logs

  log "(c) elastic PyTorchJob 2:3 (kubeddp render)"
  render pytorchjob --name kubeddp-elastic-cpu --elastic 2:3 --nodes 3 --nproc-per-node 1 \
    --max-restarts 3 > /tmp/kubeddp-elastic-cpu.yaml
  kubectl apply -f /tmp/kubeddp-elastic-cpu.yaml
  kubectl wait --for=jsonpath='{.status.phase}'=Running pod/kubeddp-elastic-cpu-worker-0 \
    --timeout=300s
  assert_metrics kubeddp-elastic-cpu-worker-0 3
  replace_pod kubeddp-elastic-cpu-worker-2
  wait_job pytorchjob kubeddp-elastic-cpu
  assert_trained training.kubeflow.org/job-name=kubeddp-elastic-cpu 3
}

leg_trainer() {
  install_trainer
  log "TrainJob, 2 nodes (kubeddp render trainjob; k8s/trainjob.yaml with the CPU image)"
  render trainjob --name kubeddp-trainjob-cpu --nodes 2 --nproc-per-node 1 \
    > /tmp/kubeddp-trainjob-cpu.yaml
  kubectl apply -f /tmp/kubeddp-trainjob-cpu.yaml
  wait_job trainjob kubeddp-trainjob-cpu
  assert_trained jobset.sigs.k8s.io/jobset-name=kubeddp-trainjob-cpu 2
}

leg_indexedjob() {
  log "Indexed Job, 2 pods, no operator (kubeddp render indexedjob)"
  render indexedjob --name kubeddp-indexed-cpu --nodes 2 --nproc-per-node 1 \
    > /tmp/kubeddp-indexed-cpu.yaml
  kubectl apply -f /tmp/kubeddp-indexed-cpu.yaml
  wait_job job kubeddp-indexed-cpu
  assert_trained batch.kubernetes.io/job-name=kubeddp-indexed-cpu 2
}

# Sourced (to reuse the helpers): define them, run nothing.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  trap - EXIT
  return 0
fi
case "${LEG}" in
  training-operator | trainer | indexedjob) ;;
  *) fail "unknown leg '${LEG}': use training-operator, trainer or indexedjob" ;;
esac
for tool in docker kind kubectl helm; do
  command -v "${tool}" > /dev/null || fail "${tool} is not on PATH"
done
[ -x "${KUBEDDP}" ] || fail "kubeddp not found (${KUBEDDP}): run make setup, or set KUBEDDP"
cluster_up
image_up
"leg_${LEG//-/_}"
log "${LEG}: all jobs Succeeded"

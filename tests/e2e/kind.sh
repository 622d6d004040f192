#!/usr/bin/env bash
# End-to-end on a real Kubernetes (kind): the CPU image, the operators, gloo jobs to Succeeded.
#
#   tests/e2e/kind.sh training-operator   # Training Operator v1.9: PyTorchJob from k8s/, a
#                                         # Worker-only PyTorchJob, the Helm chart (ci values),
#                                         # an elastic PyTorchJob
#   tests/e2e/kind.sh trainer             # Kubeflow Trainer v2.3 (Helm chart) + JobSet: TrainJob
#                                         # (kubeddp render + kubectl apply, the Helm chart)
#   tests/e2e/kind.sh indexedjob          # no operator: a batch/v1 Indexed Job (kubeddp
#                                         # render + kubectl apply, the Helm chart)
#
# Needs docker, kind, kubectl, helm and kubeddp (the repo's .venv, or KUBEDDP=...) on PATH.
# Environment: KIND_CLUSTER (default kubeddp-e2e), KIND_NODE_IMAGE, KEEP_CLUSTER=1 (do not
# delete a cluster this script created), SKIP_BUILD=1 (kubeddp:cpu is already built),
# JOB_TIMEOUT (seconds per job, default 600), KIND_WORK_DIR (the rendered manifests, /tmp).
# Every job must reach Succeeded/Complete; rank 0's log must show the expected world size and a
# final loss below the first; while the elastic job trains, its /metrics must report
# kubeddp_world_size, then one of its pods is deleted mid-training, must be recreated, must
# train in the group again (its own /metrics) and the job must resume from a checkpoint. Every
# kind (Worker-only PyTorchJob, the chart, elastic, TrainJob, Indexed Job) loses a pod
# mid-training, the rank-0 pod (worker-0, the c10d store host, completion index 0) included,
# and must resume from its checkpoint and succeed. A check
# that cannot be exercised (the job ended first) fails the run; every wait polls until the
# object exists. On any failure: pods, events, descriptions and logs are printed.
set -euo pipefail
cd "$(dirname "$0")/../.."

LEG="${1:?usage: tests/e2e/kind.sh training-operator|trainer|indexedjob}"
CLUSTER="${KIND_CLUSTER:-kubeddp-e2e}"
# kind v0.29.0's image for Kubernetes 1.33 (tag and digest from the kind release notes):
# Kubeflow Trainer v2.3 supports Kubernetes 1.32-1.35.
NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.33.1@sha256:050072256b9a903bd914c0b2866828150cb229cea0efe5892e2b644d5dd3b34f}"
TRAINING_OPERATOR_REF="v1.9.4"
TRAINER_REF="v2.3.0"
KUSTOMIZE_BASE="github.com/kubeflow/trainer.git/manifests/overlays"
IMAGE="kubeddp:cpu"
JOB_TIMEOUT="${JOB_TIMEOUT:-600}"
WORK="${KIND_WORK_DIR:-/tmp}" # where the rendered manifests are written
KUBEDDP="${KUBEDDP:-$(command -v kubeddp || echo .venv/bin/kubeddp)}"
# A short gloo regression run: enough steps to watch /metrics while it trains.
TRAIN_ARGS=(
  --set workload.name=regression --set train.max_steps=300 --set train.epochs=20
  --set train.log_every=20 --set checkpoint.every_steps=50
  --set ddp.backend=gloo --set ddp.device=cpu
)
# The elastic leg trains for minutes (a few ms per step here): long enough to scrape /metrics,
# delete a pod, and see the recreated pod train in the group again before the end.
ELASTIC_TRAIN_ARGS=(
  --set train.max_steps=30000 --set train.epochs=1000 --set train.log_every=1000
  --set checkpoint.every_steps=1000
)
# kind has one node and its `standard` storage class has no ReadWriteMany: every job's
# checkpoint claim is ReadWriteOnce (all pods run on that node).
CPU_POD=(--image "${IMAGE}" --cpu 250m --memory 512Mi --memory-limit 1Gi --shm-size 256Mi
  --checkpoint-size 1Gi --checkpoint-access-mode ReadWriteOnce)
# TrainJob has no pull-policy field (the runtime's container decides; a tag other than
# :latest means IfNotPresent): render refuses the option for it.
PULL_LOCAL=(--image-pull-policy IfNotPresent)
# Every kind is also installed with `helm install` from the chart's kind values; a TrainJob
# takes no pull policy, TTL or Job backoffLimit (its runtime decides them) and no `cpu` word.
CHART_KIND_VALUES=(-f charts/kubeddp/ci/cpu-kind-values.yaml)
TRAINJOB_CHART=(--set kind=TrainJob --set image.pullPolicy=null --set backoffLimit=null
  --set ttlSecondsAfterFinished=null --set nprocPerNode=auto)
INDEXEDJOB_CHART=(--set kind=IndexedJob)
RETRY_PAUSE="${RETRY_PAUSE:-5}" # seconds between two tries of `retry`
RANK0_SELECTOR=""  # the pod lose_rank0_pod deletes (set per job)
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
    sleep "${RETRY_PAUSE}"
  done
}

# apply_job FILE: kubectl apply of a rendered job. A TrainJob comes right after its runtime,
# and Trainer's webhook (which reads runtimes from its controller's cache) may refuse it for a
# moment: the same apply again creates it (what exists stays unchanged).
apply_job() {
  retry 60 kubectl apply -f "$1"
}

# chart_install RELEASE JOB_NAME [HELM OPTIONS...]: helm install of the chart with the kind CI
# values; a TrainJob's runtime is a pre-install hook, created before the release's objects.
chart_install() {
  local release="$1" name="$2"
  shift 2
  helm install "${release}" charts/kubeddp "${CHART_KIND_VALUES[@]}" \
    --set fullnameOverride="${name}" "$@"
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
  # The validating webhook must answer before a TrainJob can be created. A server dry run
  # creates nothing, so the probe runs on the installed runtime (a runtime of its own, dry-run
  # beside it, would never exist for the webhook).
  "${KUBEDDP}" render trainjob --name kubeddp-webhook-probe --image "${IMAGE}" --cpu 250m \
    --memory 512Mi --checkpoints-lost-on-retry --no-own-runtime \
    --validate-against offline > "${WORK}/kubeddp-webhook-probe.yaml"
  retry 180 kubectl apply --dry-run=server -f "${WORK}/kubeddp-webhook-probe.yaml"
}

# job_conditions KIND NAME: the job's true condition types ("" while it has none or is absent).
job_conditions() {
  kubectl get "$1" "$2" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}' \
    2> /dev/null || true
}

# fail_if_finished KIND NAME WHAT: the job ended before WHAT could be checked: a check that is
# not exercised is a failure, never a pass.
fail_if_finished() {
  case " $(job_conditions "$1" "$2") " in
    *" Succeeded "* | *" Complete "* | *" Failed "*)
      fail "$1/$2 finished before $3 (not exercised); make the run longer"
      ;;
  esac
}

# wait_pod_running POD [SECONDS]: poll until the pod exists and runs (it may not exist yet
# right after `kubectl apply`: the operator creates it).
wait_pod_running() {
  local pod="$1" end=$((SECONDS + ${2:-300})) phase
  while :; do
    phase="$(kubectl get pod "${pod}" -o jsonpath='{.status.phase}' 2> /dev/null || true)"
    [ "${phase}" = Running ] && return 0
    case "${phase}" in
      Succeeded | Failed) fail "pod ${pod} is ${phase}, expected Running" ;;
    esac
    [ "${SECONDS}" -lt "${end}" ] || fail "pod ${pod} not Running after ${2:-300}s (${phase:-absent})"
    sleep 2
  done
}

# wait_job KIND NAME: Succeeded/Complete, or fail fast on Failed.
wait_job() {
  local kind="$1" name="$2" end=$((SECONDS + JOB_TIMEOUT)) conditions
  log "waiting for ${kind}/${name}"
  while :; do
    conditions="$(job_conditions "${kind}" "${name}")"
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

# assert_resumed SELECTOR: some pod of the job resumed from a checkpoint of a step > 0.
assert_resumed() {
  local selector="$1" steps
  steps="$(kubectl logs -l "${selector}" --tail=-1 --max-log-requests 10 \
    | sed -nE 's/.*resumed from [^ ]+ \(step ([0-9]+).*/\1/p')"
  grep -Eq '^[1-9][0-9]*$' <<< "${steps}" \
    || fail "${selector}: no pod resumed from a checkpoint after the pod replacement"
  log "${selector}: resumed from step(s) $(tr '\n' ' ' <<< "${steps}")"
}

# assert_metrics POD WORLD_SIZE JOB_KIND JOB_NAME: scrape the pod's own /metrics from inside it
# while the job trains; the job ending first fails the check instead of skipping it.
assert_metrics() {
  local pod="$1" world="$2" end=$((SECONDS + 300)) body value
  log "scraping ${pod}:9400/metrics while it trains"
  while :; do
    body="$(kubectl exec "${pod}" -- python -c \
      'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9400/metrics").read().decode())' \
      2> /dev/null || true)"
    value="$(awk '$1 == "kubeddp_world_size" { print int($2) }' <<< "${body}")"
    if grep -Eq '^kubeddp_step [1-9]' <<< "${body}" && [ "${value}" = "${world}" ]; then
      log "${pod}: kubeddp_world_size ${value} while training"
      return 0
    fi
    fail_if_finished "$3" "$4" "${pod} reported kubeddp_world_size ${world} on /metrics"
    [ "${SECONDS}" -lt "${end}" ] \
      || fail "${pod}: no kubeddp_step > 0 with kubeddp_world_size ${world} in 300s (${value:-absent})"
    sleep 2
  done
}

# replace_pod POD JOB_KIND JOB_NAME: delete a training pod mid-run; the operator must create a
# new one (new UID) while the job still runs.
replace_pod() {
  local pod="$1" uid end=$((SECONDS + 300))
  wait_pod_running "${pod}"
  fail_if_finished "$2" "$3" "${pod} could be replaced"
  uid="$(kubectl get pod "${pod}" -o jsonpath='{.metadata.uid}')"
  log "deleting ${pod} mid-run"
  kubectl delete pod "${pod}" --wait=false
  until [ "$(kubectl get pod "${pod}" -o jsonpath='{.metadata.uid}' 2> /dev/null)" != "${uid}" ] \
    && kubectl get pod "${pod}" > /dev/null 2>&1; do
    [ "${SECONDS}" -lt "${end}" ] || fail "${pod} was not recreated within 300s"
    sleep 2
  done
  wait_pod_running "${pod}"
  log "${pod} recreated by the operator"
}

# pod_by_selector SELECTOR: the name of the one live pod that matches (Jobs add a random suffix).
pod_by_selector() {
  kubectl get pods -l "$1" --field-selector=status.phase!=Failed,status.phase!=Succeeded \
    -o jsonpath='{.items[0].metadata.name}' 2> /dev/null || true
}

# replace_pod_by_selector SELECTOR JOB_KIND JOB_NAME: delete the pod that matches mid-run (the
# pod gets SIGTERM, saves and stops); a new pod must take its place and run while the job runs.
replace_pod_by_selector() {
  local selector="$1" pod new end=$((SECONDS + 300))
  until pod="$(pod_by_selector "${selector}")" && [ -n "${pod}" ]; do
    [ "${SECONDS}" -lt "${end}" ] || fail "no pod matches ${selector} after 300s"
    sleep 2
  done
  wait_pod_running "${pod}"
  fail_if_finished "$2" "$3" "a pod of ${selector} could be replaced"
  log "deleting ${pod} (${selector}) mid-run"
  kubectl delete pod "${pod}" --wait=false
  until new="$(pod_by_selector "${selector}")" && [ -n "${new}" ] && [ "${new}" != "${pod}" ]; do
    [ "${SECONDS}" -lt "${end}" ] || fail "no new pod for ${selector} within 300s"
    sleep 2
  done
  wait_pod_running "${new}"
  log "${pod} replaced by ${new}"
}

# wait_training SELECTOR JOB_KIND JOB_NAME: some pod of the job logged a training step past the
# first checkpoint (so a pod lost now resumes from a step > 0).
wait_training() {
  local end=$((SECONDS + 300))
  until kubectl logs -l "$1" --tail=-1 --max-log-requests 10 2> /dev/null \
    | grep -Eq '^step [0-9]*[1-9][0-9]{3}/'; do
    fail_if_finished "$2" "$3" "it trained past its first checkpoint"
    [ "${SECONDS}" -lt "${end}" ] || fail "$1: no step >= 1000 logged in 300s"
    sleep 3
  done
}

# lose_rank0_pod SELECTOR JOB_KIND JOB_NAME: mid-training, the pod of node rank 0 is deleted; the
# job must replace it, resume from its checkpoint and succeed.
lose_rank0_pod() {
  local selector="$1" kind="$2" name="$3"
  wait_training "${selector}" "${kind}" "${name}"
  replace_pod_by_selector "${RANK0_SELECTOR}" "${kind}" "${name}"
  wait_job "${kind}" "${name}"
  assert_resumed "${selector}"
}

# render KIND [OPTIONS...]: the CPU pod and the short run, then OPTIONS (a later --set wins).
render() {
  local kind="$1"
  shift
  "${KUBEDDP}" render "${kind}" "${CPU_POD[@]}" "${TRAIN_ARGS[@]}" "$@"
}

leg_training_operator() {
  install_training_operator

  log "(a) k8s/pytorchjob-cpu-gloo.yaml"
  # k8s/ carries no secret (anyone may read it): its header says to make the keeper's first
  kubectl create secret generic kubeddp-cpu-keeper-token \
    --from-literal=token="$(head -c 32 /dev/urandom | base64)"
  apply_job k8s/pytorchjob-cpu-gloo.yaml
  wait_job pytorchjob kubeddp-cpu
  assert_trained training.kubeflow.org/job-name=kubeddp-cpu 2

  log "(a2) Worker-only PyTorchJob (the default shape): worker-0 lost mid-training"
  local lost=kubeddp-workers-loss
  render pytorchjob --name "${lost}" --nodes 2 --nproc-per-node 1 "${PULL_LOCAL[@]}" \
    "${ELASTIC_TRAIN_ARGS[@]}" > "${WORK}/${lost}.yaml"
  apply_job "${WORK}/${lost}.yaml"
  RANK0_SELECTOR="training.kubeflow.org/job-name=${lost},training.kubeflow.org/replica-index=0"
  lose_rank0_pod "training.kubeflow.org/job-name=${lost}" pytorchjob "${lost}"
  assert_trained "training.kubeflow.org/job-name=${lost}" 2

  log "(b) helm install with charts/kubeddp/ci/cpu-kind-values.yaml"
  chart_install ci kubeddp-ci
  wait_job pytorchjob kubeddp-ci
  assert_trained training.kubeflow.org/job-name=kubeddp-ci 4
  helm test ci --logs

  log "(b2) the chart, longer: worker-0 lost mid-training"
  chart_install ci-loss kubeddp-ci-loss --set backoffLimit=null \
    --set config.train.max_steps=30000 --set config.train.epochs=1000 \
    --set config.train.log_every=1000 --set config.checkpoint.every_steps=1000
  RANK0_SELECTOR="training.kubeflow.org/job-name=kubeddp-ci-loss,training.kubeflow.org/replica-index=0"
  lose_rank0_pod training.kubeflow.org/job-name=kubeddp-ci-loss pytorchjob kubeddp-ci-loss
  assert_trained training.kubeflow.org/job-name=kubeddp-ci-loss 4

  log "(c) elastic PyTorchJob 2:3 (kubeddp render): a pod replaced mid-training"
  local job=kubeddp-elastic-cpu
  render pytorchjob --name "${job}" --elastic 2:3 --nodes 3 --nproc-per-node 1 \
    --max-restarts 3 "${PULL_LOCAL[@]}" "${ELASTIC_TRAIN_ARGS[@]}" > "${WORK}/${job}.yaml"
  apply_job "${WORK}/${job}.yaml"
  wait_pod_running "${job}-worker-0"
  assert_metrics "${job}-worker-0" 3 pytorchjob "${job}"
  replace_pod "${job}-worker-2" pytorchjob "${job}"
  # The recreated pod trains in the group of three again, before the job ends.
  assert_metrics "${job}-worker-2" 3 pytorchjob "${job}"
  # worker-0 hosts the c10d store: the others rejoin the recreated one.
  replace_pod "${job}-worker-0" pytorchjob "${job}"
  assert_metrics "${job}-worker-0" 3 pytorchjob "${job}"
  wait_job pytorchjob "${job}"
  assert_resumed "training.kubeflow.org/job-name=${job}"
  assert_trained "training.kubeflow.org/job-name=${job}" 3
}

# On a cluster that serves Trainer's API (and not training-operator's): the chart's kind auto
# (Helm's capabilities from the real discovery) and `kubeddp submit` without a KIND (its own
# discovery) pick TrainJob; an upgrade of a release that runs an Indexed Job keeps it (the
# chart's lookup of the release's job).
assert_kind_auto() {
  log "kind auto: helm install --dry-run=server and kubeddp submit pick the TrainJob"
  helm install ci-auto charts/kubeddp "${CHART_KIND_VALUES[@]}" "${TRAINJOB_CHART[@]}" \
    --set kind=auto --dry-run=server > "${WORK}/ci-auto.txt"
  grep -q '^kind: TrainJob$' "${WORK}/ci-auto.txt" \
    || fail "kind auto did not render a TrainJob where Trainer is served"
  "${KUBEDDP}" submit --name kubeddp-auto --dry-run client --validate-against offline \
    > "${WORK}/kubeddp-auto.yaml" 2> "${WORK}/kubeddp-auto.err"
  grep -q '^kind: TrainJob$' "${WORK}/kubeddp-auto.yaml" \
    || fail "kubeddp submit without a KIND: $(head -1 "${WORK}/kubeddp-auto.err")"
  chart_install ci-kept kubeddp-ci-kept "${INDEXEDJOB_CHART[@]}"
  helm upgrade ci-kept charts/kubeddp "${CHART_KIND_VALUES[@]}" --set fullnameOverride=kubeddp-ci-kept \
    --set kind=auto --dry-run=server > "${WORK}/ci-kept.txt"
  if ! grep -q '^kind: Job$' "${WORK}/ci-kept.txt" || grep -q '^kind: TrainJob$' "${WORK}/ci-kept.txt"; then
    fail "helm upgrade with kind auto did not keep the release's Indexed Job"
  fi
  helm uninstall ci-kept --wait
}

leg_trainer() {
  install_trainer
  assert_kind_auto
  log "TrainJob, 2 nodes (kubeddp render trainjob; k8s/trainjob.yaml with the CPU image)"
  render trainjob --name kubeddp-trainjob-cpu --nodes 2 --nproc-per-node 1 \
    > "${WORK}/kubeddp-trainjob-cpu.yaml"
  apply_job "${WORK}/kubeddp-trainjob-cpu.yaml"
  wait_job trainjob kubeddp-trainjob-cpu
  assert_trained jobset.sigs.k8s.io/jobset-name=kubeddp-trainjob-cpu 2

  log "TrainJob by helm install (its runtime a pre-install hook), 2 pods x 2 workers"
  chart_install ci-trainjob kubeddp-ci-trainjob "${TRAINJOB_CHART[@]}"
  wait_job trainjob kubeddp-ci-trainjob
  assert_trained jobset.sigs.k8s.io/jobset-name=kubeddp-ci-trainjob 4
  helm test ci-trainjob --logs
  # A hook is not the release's: uninstall leaves the runtime (as docs/manifests-and-chart.md
  # says), and a new install of the same name replaces it.
  helm uninstall ci-trainjob --wait
  kubectl get trainingruntime kubeddp-ci-trainjob > /dev/null \
    || fail "helm uninstall deleted the runtime hook; update docs/manifests-and-chart.md"
  kubectl delete trainingruntime kubeddp-ci-trainjob

  log "TrainJob, 3 nodes on its own TrainingRuntime: node 0 lost mid-training"
  local lost=kubeddp-trainjob-loss selector
  render trainjob --name "${lost}" --nodes 3 --nproc-per-node 1 "${ELASTIC_TRAIN_ARGS[@]}" \
    > "${WORK}/${lost}.yaml"
  apply_job "${WORK}/${lost}.yaml"
  selector="jobset.sigs.k8s.io/jobset-name=${lost}"
  RANK0_SELECTOR="${selector},batch.kubernetes.io/job-completion-index=0"
  lose_rank0_pod "${selector}" trainjob "${lost}"
  assert_trained "${selector}" 3
}

leg_indexedjob() {
  log "Indexed Job, 2 pods, no operator (kubeddp render indexedjob)"
  render indexedjob --name kubeddp-indexed-cpu --nodes 2 --nproc-per-node 1 "${PULL_LOCAL[@]}" \
    > "${WORK}/kubeddp-indexed-cpu.yaml"
  apply_job "${WORK}/kubeddp-indexed-cpu.yaml"
  wait_job job kubeddp-indexed-cpu
  assert_trained batch.kubernetes.io/job-name=kubeddp-indexed-cpu 2

  log "Indexed Job by helm install, 2 pods x 2 workers"
  chart_install ci-indexed kubeddp-ci-indexed "${INDEXEDJOB_CHART[@]}"
  wait_job job kubeddp-ci-indexed
  assert_trained batch.kubernetes.io/job-name=kubeddp-ci-indexed 4

  log "Indexed Job, 3 pods: index 0 (the rendezvous host) lost mid-training"
  local lost=kubeddp-indexed-loss selector
  render indexedjob --name "${lost}" --nodes 3 --nproc-per-node 1 "${PULL_LOCAL[@]}" \
    "${ELASTIC_TRAIN_ARGS[@]}" > "${WORK}/${lost}.yaml"
  apply_job "${WORK}/${lost}.yaml"
  selector="batch.kubernetes.io/job-name=${lost}"
  RANK0_SELECTOR="${selector},batch.kubernetes.io/job-completion-index=0"
  lose_rank0_pod "${selector}" job "${lost}"
  assert_trained "${selector}" 3
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

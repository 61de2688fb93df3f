#!/usr/bin/env node
// Runs both checkers over samples/: files named *_ok*.sse must pass,
// files named *_bad_*.sse must fail with {"ok":false}. `npm test` runs this.
import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
let failures = 0;
for (const name of readdirSync(join(here, "samples")).sort()) {
  if (!name.endsWith(".sse")) continue;
  const script = name.startsWith("ai_sdk_") ? "ai_sdk_check.mjs" : name.startsWith("ag_ui_") ? "ag_ui_check.mjs" : null;
  if (!script) continue;
  const expectOk = !name.includes("_bad_");
  let code = 0;
  let out;
  try {
    out = execFileSync(process.execPath, [join(here, script), join(here, "samples", name)], { encoding: "utf8" });
  } catch (e) {
    code = e.status;
    out = e.stdout;
  }
  const lines = out.trim().split("\n");
  const res = lines.length === 1 ? JSON.parse(lines[0]) : null;
  const good = res !== null && res.ok === expectOk && (code === 0) === expectOk;
  if (!good) failures++;
  console.log(`${good ? "PASS" : "FAIL"} ${name} (expected ok=${expectOk}, got exit ${code})${good ? "" : `\n  ${out.trim()}`}`);
}
process.exitCode = failures === 0 ? 0 : 1;

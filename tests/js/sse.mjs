// Minimal, strict reader for a recorded text/event-stream body.
//
// Follows the WHATWG event-stream parsing rules (line endings CRLF/LF/CR,
// ':' comments, "field: value" with one optional space after the colon,
// data lines joined with "\n", an event dispatched on a blank line) and
// additionally reports anything a well-behaved streamgate encoder should
// never send: unknown field names, several data lines in one event, and a
// final event that is not terminated by a blank line.
//
// Only node built-ins; no network.

import { readFileSync } from "node:fs";

/**
 * @param {string} text the whole response body
 * @returns {{ events: {data: string, event?: string, id?: string, line: number}[],
 *             comments: number, problems: string[] }}
 */
export function parseSse(text) {
  const events = [];
  const problems = [];
  let comments = 0;
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const lines = text.split(/\r\n|\r|\n/);
  // A body that ends with a newline yields one trailing empty string that is
  // not a line of its own.
  if (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();

  let data = null; // array of data-line values for the event being built
  let event;
  let id;
  let startLine = 0;

  const dispatch = () => {
    if (data !== null) {
      if (data.length > 1) {
        problems.push(
          `line ${startLine}: event has ${data.length} data lines (encoder should emit one JSON document per data line)`,
        );
      }
      const ev = { data: data.join("\n"), line: startLine };
      if (event !== undefined) ev.event = event;
      if (id !== undefined) ev.id = id;
      events.push(ev);
    }
    data = null;
    event = undefined;
    id = undefined;
  };

  lines.forEach((line, i) => {
    const lineNo = i + 1;
    if (line === "") {
      dispatch();
      return;
    }
    if (line.startsWith(":")) {
      comments++;
      return;
    }
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        if (data === null) {
          data = [];
          startLine = lineNo;
        }
        data.push(value);
        break;
      case "event":
        event = value;
        break;
      case "id":
        id = value;
        break;
      case "retry":
        if (!/^\d+$/.test(value)) problems.push(`line ${lineNo}: retry value is not an integer`);
        break;
      default:
        problems.push(`line ${lineNo}: unknown SSE field ${JSON.stringify(field)}`);
    }
  });

  if (data !== null) {
    problems.push(
      `line ${startLine}: last event is not terminated by a blank line (a real EventSource would drop it)`,
    );
    dispatch();
  }
  return { events, comments, problems };
}

/** Reads argv[2] (or fails with a usage message). */
export function readBodyFromArgs(usage) {
  const file = process.argv[2];
  if (!file) throw new Error(`usage: ${usage}`);
  return readFileSync(file);
}

/** Prints one JSON line and sets the exit code. */
export function report(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
  process.exitCode = obj.ok ? 0 : 1;
}

export function errorText(err) {
  if (err == null) return String(err);
  if (typeof err === "string") return err;
  let msg = err.message ?? String(err);
  if (err.cause && err.cause !== err) {
    const c = err.cause;
    const cmsg = Array.isArray(c?.issues) ? JSON.stringify(c.issues) : (c?.message ?? String(c));
    if (cmsg && !msg.includes(cmsg)) msg += ` (cause: ${cmsg})`;
  }
  return msg;
}

/**
 * Compacts zod issues into "path: message" strings. For a union failure
 * only the branch whose `type` literal matched is reported, so an error
 * says which field of which chunk/event type is wrong instead of listing
 * every union member.
 */
export function summarizeIssues(issues, value, base = []) {
  const out = [];
  for (const iss of issues ?? []) {
    const path = [...base, ...(iss.path ?? [])];
    if (iss.code === "invalid_union" && Array.isArray(iss.errors) && iss.errors.length > 0) {
      const matching = iss.errors.filter((branch) => !branch.some((b) => b.path?.[0] === "type"));
      if (matching.length === 1) {
        out.push(...summarizeIssues(matching[0], value, path));
      } else if (matching.length === 0) {
        out.push(`${fmt(path)}: unknown type ${JSON.stringify(value?.type)}`);
      } else {
        const alts = matching.map((b) => summarizeIssues(b, value, path).join(", "));
        out.push(`${fmt(path)}: matches no alternative (${alts.join(" | ")})`);
      }
      continue;
    }
    out.push(`${fmt(path)}: ${iss.message}`);
  }
  return out;
}

function fmt(path) {
  return path.length > 0 ? path.join(".") : "(root)";
}

/** `import(spec)` with a hint when tests/js/node_modules is not installed. */
export async function importDep(spec) {
  try {
    return await import(spec);
  } catch (err) {
    if (err?.code === "ERR_MODULE_NOT_FOUND") {
      throw new Error(`cannot load ${spec}: run \`npm ci\` in tests/js first (${err.message})`);
    }
    throw err;
  }
}

#!/usr/bin/env node
// Checks a recorded AG-UI event stream with the real `@ag-ui/core` package.
//
//   node ag_ui_check.mjs <file.sse>
//
// <file.sse> is the whole SSE response body: `data: {json}` events separated
// by blank lines. A trailing `data: [DONE]` is tolerated (and ignored).
//
// Every event is validated with `EventSchema` from `@ag-ui/core/schemas`
// (the zod discriminated union on `type`; also exported as `EventSchemas`).
//
// Prints exactly one JSON line:
//   {"ok":true,"count":N,"types":["RUN_STARTED",...]}
//   {"ok":false,"error":"...","event":<offending event or null>}   (exit 1)

import { errorText, importDep, parseSse, readBodyFromArgs, report, summarizeIssues } from "./sse.mjs";

const USAGE = "node ag_ui_check.mjs <file.sse>";

class EventError extends Error {
  constructor(message, event) {
    super(message);
    this.event = event;
  }
}

async function main() {
  // Imported dynamically so a missing node_modules still yields a JSON line.
  const { EventSchema } = await importDep("@ag-ui/core/schemas");
  const body = readBodyFromArgs(USAGE);
  const { events, problems } = parseSse(body.toString("utf8"));
  if (problems.length > 0) throw new Error(`SSE framing: ${problems.join("; ")}`);

  const types = [];
  events.forEach((e, i) => {
    if (e.data === "[DONE]") {
      if (i !== events.length - 1) throw new Error(`data: [DONE] at line ${e.line} is not the last event`);
      return;
    }
    let value;
    try {
      value = JSON.parse(e.data);
    } catch (err) {
      throw new EventError(`event #${i} (line ${e.line}): invalid JSON: ${err.message}`, e.data);
    }
    const result = EventSchema.safeParse(value);
    if (!result.success) {
      const why = summarizeIssues(result.error.issues, value).join("; ");
      throw new EventError(
        `event #${i} (line ${e.line}, type ${JSON.stringify(value?.type)}) failed EventSchema: ${why}`,
        value,
      );
    }
    types.push(result.data.type);
  });
  if (types.length === 0) throw new Error("no events in stream");
  report({ ok: true, count: types.length, types });
}

main().catch((err) =>
  report({ ok: false, error: errorText(err), event: err instanceof EventError ? err.event : null }),
);

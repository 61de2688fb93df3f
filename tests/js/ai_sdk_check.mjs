#!/usr/bin/env node
// Checks a recorded Vercel AI SDK "UI message stream" (protocol v1,
// header x-vercel-ai-ui-message-stream: v1) with the real `ai` package.
//
//   node ai_sdk_check.mjs <file.sse> [--allow-missing-done]
//
// <file.sse> is the whole response body as the server sent it:
//   data: {json}\n\n ... data: [DONE]\n\n
//
// Steps, mirroring what the SDK's own DefaultChatTransport does:
//   1. strict SSE framing check (sse.mjs) and the trailing [DONE] sentinel;
//   2. the body bytes go through `parseJsonEventStream({ stream, schema:
//      uiMessageChunkSchema })` -- the package's SSE parser plus its lazy zod
//      chunk schema -- and any chunk that fails validation fails the check;
//   3. the validated chunks are fed to `readUIMessageStream({ stream })`;
//      any processing error (e.g. text-delta without text-start, tool output
//      for an unknown toolCallId) fails the check.
//
// Prints exactly one JSON line:
//   {"ok":true,"message":<last UIMessage or null>,"chunkTypes":[...],"errorTexts":[...]}
//   {"ok":false,"error":"..."}            (exit code 1)
// `errorTexts` lists the errorText of `error` chunks (valid protocol chunks
// that readUIMessageStream reports through onError instead of the message).

import { errorText, importDep, parseSse, readBodyFromArgs, report, summarizeIssues } from "./sse.mjs";

const USAGE = "node ai_sdk_check.mjs <file.sse> [--allow-missing-done]";

async function main() {
  // Imported dynamically so a missing node_modules still yields a JSON line.
  const { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } = await importDep("ai");
  const body = readBodyFromArgs(USAGE);
  const allowMissingDone = process.argv.includes("--allow-missing-done");

  // 1. framing
  const { events, problems } = parseSse(body.toString("utf8"));
  if (problems.length > 0) throw new Error(`SSE framing: ${problems.join("; ")}`);
  const doneAt = events.findIndex((e) => e.data === "[DONE]");
  if (doneAt === -1 && !allowMissingDone) throw new Error("stream does not end with data: [DONE]");
  if (doneAt !== -1 && doneAt !== events.length - 1) {
    throw new Error(`data: [DONE] is event #${doneAt} but ${events.length - 1 - doneAt} event(s) follow it`);
  }
  for (const e of events) {
    if (e.event !== undefined && e.event !== "message") {
      throw new Error(`line ${e.line}: unexpected "event: ${e.event}" (UI message streams use unnamed events)`);
    }
  }

  // 2. the SDK's own SSE parsing + chunk schema validation
  const bytes = new ReadableStream({
    start(controller) {
      controller.enqueue(new Uint8Array(body));
      controller.close();
    },
  });
  const chunks = [];
  let index = 0;
  for await (const result of parseJsonEventStream({ stream: bytes, schema: uiMessageChunkSchema })) {
    if (!result.success) {
      // TypeValidationError wrapping a ZodError, or a JSONParseError.
      const issues = result.error?.cause?.issues;
      const why = Array.isArray(issues)
        ? summarizeIssues(issues, result.rawValue).join("; ")
        : errorText(result.error);
      throw new Error(
        `chunk #${index} failed uiMessageChunkSchema: ${why}; chunk=${JSON.stringify(result.rawValue)}`,
      );
    }
    chunks.push(result.value);
    index++;
  }
  if (chunks.length === 0) throw new Error("no chunks in stream");

  // 3. the SDK's own UIMessage reducer
  const chunkStream = new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(c);
      controller.close();
    },
  });
  const errors = [];
  let last;
  for await (const message of readUIMessageStream({
    stream: chunkStream,
    onError: (e) => errors.push(e),
  })) {
    last = message;
  }

  const errorTexts = chunks.filter((c) => c.type === "error").map((c) => c.errorText);
  const remaining = [...errorTexts];
  const failures = [];
  for (const e of errors) {
    // `error` chunks surface as plain `new Error(chunk.errorText)`.
    const k = e?.constructor === Error ? remaining.indexOf(e.message) : -1;
    if (k !== -1) remaining.splice(k, 1);
    else failures.push(errorText(e));
  }
  if (failures.length > 0) throw new Error(`readUIMessageStream: ${failures.join("; ")}`);
  // `message` is null when the reducer never yielded (e.g. a stream holding
  // only `start` without messageId, `error` and `finish`).
  report({ ok: true, message: last ?? null, chunkTypes: chunks.map((c) => c.type), errorTexts });
}

main().catch((err) => report({ ok: false, error: errorText(err) }));

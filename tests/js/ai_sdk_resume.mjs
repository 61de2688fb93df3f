#!/usr/bin/env node
// Resumes a run's UI message stream the way `useChat({ resume: true })` does: the real
// `ai` package's DefaultChatTransport.reconnectToStream({ chatId }) against
// `<api>/<chatId>/stream`, its chunks read into a UI message by readUIMessageStream.
//
//   node ai_sdk_resume.mjs <api> <chatId> <token>
//
// Prints exactly one JSON line:
//   {"ok":true,"active":false}                      (204: no active stream)
//   {"ok":true,"active":true,"message":<UIMessage>,"chunkTypes":[...]}
//   {"ok":false,"error":"..."}                      (exit code 1)

import { errorText, importDep, report } from "./sse.mjs";

async function main() {
  const { DefaultChatTransport, readUIMessageStream } = await importDep("ai");
  const [api, chatId, token] = process.argv.slice(2);
  if (!api || !chatId || !token) throw new Error("usage: node ai_sdk_resume.mjs <api> <chatId> <token>");
  const transport = new DefaultChatTransport({ api, headers: { Authorization: `Bearer ${token}` } });
  const stream = await transport.reconnectToStream({ chatId });
  if (stream === null) {
    report({ ok: true, active: false });
    return;
  }
  const chunkTypes = [];
  const counted = stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunkTypes.push(chunk.type);
        controller.enqueue(chunk);
      },
    }),
  );
  const errors = [];
  let last;
  for await (const message of readUIMessageStream({ stream: counted, onError: (e) => errors.push(e) })) {
    last = message;
  }
  if (errors.length > 0) throw new Error(`readUIMessageStream: ${errors.map(errorText).join("; ")}`);
  report({ ok: true, active: true, message: last ?? null, chunkTypes });
}

main().catch((err) => report({ ok: false, error: errorText(err) }));

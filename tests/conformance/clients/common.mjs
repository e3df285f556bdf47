// What the Node conformance clients share: the Node side of common.py (same corpus, questions,
// manifest and checks), for apps whose instrumentation library is a Node package.
//
// No dependencies: node's own fetch and fs. Every Node client app does
//
//   const run = await Run.start("node_openai");  // reads argv[2] (the manifest path), OPENAI_BASE_URL
//   provider = new NodeTracerProvider({ spanProcessors: [run.roots, ...] });  // notes root spans only
//   for (const q of QUESTIONS) await run.question(q, async (record) => { ...; record.result(answer, docs) });
//   await run.write();
//
// and the manifest it writes is the one common.py writes, field for field, so test_conformance.py
// checks Python and Node clients alike.

import { readFileSync, writeFileSync } from "node:fs";

const SPEC = JSON.parse(readFileSync(new URL("./corpus.json", import.meta.url), "utf-8"));
export const CHAT_MODEL = SPEC.chat_model;
export const EMBEDDING_MODEL = SPEC.embedding_model;
export const TOP_K = SPEC.top_k;
export const SYSTEM_PROMPT = SPEC.system_prompt;
export const DOCS = SPEC.docs.map((d) => [d.id, d.content]);
export const QUESTIONS = SPEC.questions;

export function userPrompt(question, contents) {
  return "Context:\n" + contents.join("\n\n") + `\n\nQuestion: ${question}`;
}

function stubUrl() {
  const base = process.env.OPENAI_BASE_URL.replace(/\/+$/, "");
  return base.endsWith("/v1") ? base.slice(0, -3) : base;
}

export async function stubCalls(since = 0) {
  const response = await fetch(`${stubUrl()}/_stub/calls?since=${since}`);
  if (!response.ok) throw new Error(`stub call log: HTTP ${response.status}`);
  return response.json();
}

// A span processor that notes root spans; it only reads, so the spans exported are the library's.
export class RootSpans {
  constructor() {
    this.started = [];
  }
  onStart(span) {
    // SDK 2.x names the parent in parentSpanContext (1.x: parentSpanId)
    if (!span.parentSpanContext && !span.parentSpanId) {
      this.started.push({ trace_id: span.spanContext().traceId, name: span.name });
    }
  }
  onEnding() {}
  onEnd() {}
  shutdown() {
    return Promise.resolve();
  }
  forceFlush() {
    return Promise.resolve();
  }
  mark() {
    return this.started.length;
  }
  since(mark) {
    return this.started.slice(mark);
  }
}

class Record {
  constructor(question) {
    this.question = question;
    this.answer = null;
    this.docs = [];
  }
  // docs: [[id, score or null, content], ...]
  result(answer, docs) {
    this.answer = answer;
    this.docs = docs.map(([id, score, content]) => ({ id, score, content }));
  }
}

export class Run {
  static async start(client) {
    const run = new Run(client);
    run.callsSeen = (await stubCalls()).length;
    return run;
  }

  constructor(client) {
    // the harness names the variant, so each has its own app
    this.client = process.env.CONFORMANCE_CLIENT || client;
    this.app = SPEC.app_name_prefix + this.client;
    this.path = process.env.CONFORMANCE_MANIFEST || process.argv[2];
    if (!this.path) throw new Error("usage: node app.mjs MANIFEST_PATH (or CONFORMANCE_MANIFEST)");
    this.roots = new RootSpans();
    this.questions = [];
    this.setupRoots = [];
    this.callsSeen = 0;
  }

  // Everything before this (index building, say) is not a user request.
  async endSetup() {
    this.setupRoots = this.roots.since(0);
    this.callsSeen = (await stubCalls()).length;
  }

  async question(question, body) {
    const mark = this.roots.mark();
    const record = new Record(question);
    const started = Date.now();
    await body(record);
    const calls = await stubCalls(this.callsSeen);
    this.callsSeen += calls.length;
    const chats = calls.filter((c) => c.endpoint === "chat");
    const embeddings = calls.filter((c) => c.endpoint === "embeddings");
    if (chats.length !== 1) {
      throw new Error(`expected one chat call for ${JSON.stringify(question.text)}, stub saw ${chats.length}`);
    }
    const chat = chats[0];
    if (record.answer !== chat.answer) {
      throw new Error(`library returned ${JSON.stringify(record.answer)}, stub answered ${JSON.stringify(chat.answer)}`);
    }
    if (chat.stream !== question.stream) {
      throw new Error(`${JSON.stringify(question.text)}: stream=${chat.stream}, wanted ${question.stream}`);
    }
    const queryEmbeddings = embeddings.filter((e) => e.input.length === 1 && e.input[0] === question.text);
    this.questions.push({
      query: question.text,
      stream: question.stream,
      answer: record.answer,
      model: chat.model,
      prompt_tokens: chat.usage_reported ? chat.prompt_tokens : null,
      completion_tokens: chat.usage_reported ? chat.completion_tokens : null,
      docs: record.docs,
      embedding: queryEmbeddings.length
        ? { model: queryEmbeddings[0].model, tokens: queryEmbeddings[0].prompt_tokens }
        : null,
      embedding_calls: embeddings.length,
      root_spans: this.roots.since(mark),
      wall_s: (Date.now() - started) / 1000,
    });
  }

  write() {
    const manifest = {
      client: this.client,
      app: this.app,
      chat_model: CHAT_MODEL,
      embedding_model: EMBEDDING_MODEL,
      top_k: TOP_K,
      corpus: SPEC.docs,
      setup_root_spans: this.setupRoots,
      questions: this.questions,
    };
    writeFileSync(this.path, JSON.stringify(manifest, null, 2));
  }
}

// The vector store of the clients without a framework: cosine similarity, brute force.
export class InMemoryStore {
  constructor() {
    this.items = [];
  }
  add(ids, texts, vectors) {
    ids.forEach((id, i) => this.items.push([id, texts[i], vectors[i]]));
  }
  search(vector, k) {
    const cosine = (a, b) => {
      let dot = 0;
      let na = 0;
      let nb = 0;
      a.forEach((x, i) => {
        dot += x * b[i];
        na += x * x;
        nb += b[i] * b[i];
      });
      return dot / Math.sqrt(na * nb);
    };
    const scored = this.items.map(([id, text, vec]) => [id, cosine(vector, vec), text]);
    return scored.sort((a, b) => b[1] - a[1]).slice(0, k);
  }
}

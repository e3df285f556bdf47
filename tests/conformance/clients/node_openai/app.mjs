// A framework-free RAG app on the OpenAI Node SDK, traced by @arizeai/openinference-instrumentation-openai.
//
// The instrumentation records the chat and embeddings calls as OpenInference LLM and EMBEDDING
// spans; the app's own request (CHAIN) and retrieval (RETRIEVER) spans use the OpenInference
// attributes from @arizeai/openinference-semantic-conventions, as the instrumentation's docs do.
// An ES module imports `openai` before any hook could patch it, so the app hands the module to
// `manuallyInstrument`, the instrumentation's way for ESM. Spans go out over OTLP/HTTP protobuf to
// OTEL_EXPORTER_OTLP_ENDPOINT.

import { OpenAIInstrumentation } from "@arizeai/openinference-instrumentation-openai";
import {
  OpenInferenceSpanKind,
  SemanticConventions,
} from "@arizeai/openinference-semantic-conventions";
import { trace } from "@opentelemetry/api";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";
import OpenAI from "openai";

import {
  CHAT_MODEL,
  DOCS,
  EMBEDDING_MODEL,
  InMemoryStore,
  QUESTIONS,
  Run,
  SYSTEM_PROMPT,
  TOP_K,
  userPrompt,
} from "../common.mjs";

const run = await Run.start("node_openai");
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: run.app }),
  spanProcessors: [run.roots, new BatchSpanProcessor(new OTLPTraceExporter())],
});
provider.register();
const instrumentation = new OpenAIInstrumentation();
instrumentation.setTracerProvider(provider);
instrumentation.manuallyInstrument(OpenAI);
const tracer = trace.getTracer("conformance.node_openai");

const client = new OpenAI();
const store = new InMemoryStore();
const texts = DOCS.map(([, text]) => text);
const indexed = await client.embeddings.create({ model: EMBEDDING_MODEL, input: texts, encoding_format: "float" });
store.add(DOCS.map(([id]) => id), texts, indexed.data.map((e) => e.embedding));
await run.endSetup();

// one active span around `body`, ended (and marked failed) however `body` ends
function inSpan(name, attributes, body) {
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await body(span);
    } catch (error) {
      span.recordException(error);
      span.setStatus({ code: 2 });
      throw error;
    } finally {
      span.end();
    }
  });
}

for (const question of QUESTIONS) {
  await run.question(question, async (record) => {
    const chain = { [SemanticConventions.OPENINFERENCE_SPAN_KIND]: OpenInferenceSpanKind.CHAIN };
    await inSpan("answer_question", chain, async (root) => {
      root.setAttribute(SemanticConventions.INPUT_VALUE, question.text);
      const embedded = await client.embeddings.create({
        model: EMBEDDING_MODEL,
        input: question.text,
        encoding_format: "float",
      });
      const retriever = {
        [SemanticConventions.OPENINFERENCE_SPAN_KIND]: OpenInferenceSpanKind.RETRIEVER,
        [SemanticConventions.INPUT_VALUE]: question.text,
      };
      const hits = await inSpan("retrieve", retriever, async (span) => {
        const found = store.search(embedded.data[0].embedding, TOP_K);
        found.forEach(([id, score, content], i) => {
          const prefix = `${SemanticConventions.RETRIEVAL_DOCUMENTS}.${i}`;
          span.setAttribute(`${prefix}.${SemanticConventions.DOCUMENT_ID}`, id);
          span.setAttribute(`${prefix}.${SemanticConventions.DOCUMENT_SCORE}`, score);
          span.setAttribute(`${prefix}.${SemanticConventions.DOCUMENT_CONTENT}`, content);
        });
        return found;
      });
      const messages = [
        { role: "system", content: SYSTEM_PROMPT },
        { role: "user", content: userPrompt(question.text, hits.map(([, , content]) => content)) },
      ];
      let answer = "";
      if (question.stream) {
        const stream = await client.chat.completions.create({
          model: CHAT_MODEL,
          messages,
          stream: true,
          stream_options: { include_usage: true },
        });
        for await (const chunk of stream) {
          answer += chunk.choices[0]?.delta?.content ?? "";
        }
      } else {
        const completion = await client.chat.completions.create({ model: CHAT_MODEL, messages });
        answer = completion.choices[0].message.content ?? "";
      }
      root.setAttribute(SemanticConventions.OUTPUT_VALUE, answer);
      record.result(answer, hits);
    });
  });
}

await provider.shutdown();
run.write();

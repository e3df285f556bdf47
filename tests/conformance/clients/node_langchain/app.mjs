// A LangChain.js RAG chain, traced by @arizeai/openinference-instrumentation-langchain.
//
// The chain is the one of the Python LangChain client (clients/langchain/chain.py): the retriever
// and the question in parallel, then prompt | chat model | parser, so one call returns the
// documents and the answer. The retriever is the one LangChain's docs show for keeping scores:
// a `BaseRetriever` over the vector store's `similaritySearchWithScore` that puts each score in the
// document's metadata (`as_retriever()` drops them). The store is LangChain's `MemoryVectorStore`;
// documents carry our ids as `Document.id`. The instrumentation patches LangChain's callback
// manager, which an ES module hands it (`manuallyInstrument`), as its docs say.

import { LangChainInstrumentation } from "@arizeai/openinference-instrumentation-langchain";
import { MemoryVectorStore } from "@langchain/classic/vectorstores/memory";
import * as CallbackManagerModule from "@langchain/core/callbacks/manager";
import { Document } from "@langchain/core/documents";
import { StringOutputParser } from "@langchain/core/output_parsers";
import { ChatPromptTemplate } from "@langchain/core/prompts";
import { BaseRetriever } from "@langchain/core/retrievers";
import { RunnableParallel, RunnablePassthrough } from "@langchain/core/runnables";
import { ChatOpenAI, OpenAIEmbeddings } from "@langchain/openai";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";

import { CHAT_MODEL, DOCS, EMBEDDING_MODEL, QUESTIONS, Run, SYSTEM_PROMPT, TOP_K } from "../common.mjs";

class ScoredRetriever extends BaseRetriever {
  lc_namespace = ["conformance", "retrievers"];

  constructor(store, k) {
    super();
    this.store = store;
    this.k = k;
  }

  async _getRelevantDocuments(query) {
    const found = await this.store.similaritySearchWithScore(query, this.k);
    return found.map(
      ([doc, score]) => new Document({ id: doc.id, pageContent: doc.pageContent, metadata: { ...doc.metadata, score } }),
    );
  }
}

const run = await Run.start("node_langchain");
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: run.app }),
  spanProcessors: [run.roots, new BatchSpanProcessor(new OTLPTraceExporter())],
});
provider.register();
const instrumentation = new LangChainInstrumentation();
instrumentation.setTracerProvider(provider);
instrumentation.manuallyInstrument(CallbackManagerModule);

const store = new MemoryVectorStore(new OpenAIEmbeddings({ model: EMBEDDING_MODEL }));
await store.addDocuments(DOCS.map(([id, text]) => new Document({ id, pageContent: text, metadata: {} })));
const prompt = ChatPromptTemplate.fromMessages([
  ["system", SYSTEM_PROMPT],
  ["human", "Context:\n{context}\n\nQuestion: {question}"],
]);
const llm = new ChatOpenAI({ model: CHAT_MODEL, temperature: 0, streamUsage: true });
const answer = RunnablePassthrough.assign({
  context: (x) => x.context.map((d) => d.pageContent).join("\n\n"),
})
  .pipe(prompt)
  .pipe(llm)
  .pipe(new StringOutputParser());
const chain = RunnableParallel.from({
  context: new ScoredRetriever(store, TOP_K),
  question: new RunnablePassthrough(),
}).assign({ answer });
await run.endSetup();

for (const question of QUESTIONS) {
  await run.question(question, async (record) => {
    let result;
    if (question.stream) {
      result = { answer: "" };
      for await (const chunk of await chain.stream(question.text)) {
        for (const [key, value] of Object.entries(chunk)) {
          if (key === "answer") result.answer += value;
          else result[key] = value;
        }
      }
    } else {
      result = await chain.invoke(question.text);
    }
    record.result(
      result.answer,
      result.context.map((d) => [d.id, d.metadata.score, d.pageContent]),
    );
  });
}

await provider.shutdown();
run.write();

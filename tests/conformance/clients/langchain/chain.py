"""The LangChain RAG chain, shared by the OpenInference and the OpenLLMetry (traceloop) clients.

The chain is the LangChain tutorial's "RAG with sources": the retriever and the question in
parallel, then prompt | chat model | parser, so one call returns the documents and the answer.
"""

from __future__ import annotations

from typing import Any

from common import CHAT_MODEL, DOCS, EMBEDDING_MODEL, TOP_K, Question, Record
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableParallel, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import ChatOpenAI, OpenAIEmbeddings


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def build_chain() -> Runnable[str, dict[str, Any]]:
    # check_embedding_ctx_length=False: otherwise the texts are sent as tiktoken ids, and tiktoken
    # downloads its encodings on first use.
    embeddings = OpenAIEmbeddings(model=EMBEDDING_MODEL, check_embedding_ctx_length=False)
    store = InMemoryVectorStore(embeddings)
    store.add_documents([Document(page_content=text, id=doc_id) for doc_id, text in DOCS])
    retriever = store.as_retriever(search_kwargs={"k": TOP_K})
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer the question using only the context."),
            ("human", "Context:\n{context}\n\nQuestion: {question}"),
        ]
    )
    llm = ChatOpenAI(model=CHAT_MODEL, temperature=0, stream_usage=True)
    answer = (
        RunnablePassthrough.assign(context=lambda x: format_docs(x["context"]))
        | prompt
        | llm
        | StrOutputParser()
    )
    return RunnableParallel(context=retriever, question=RunnablePassthrough()).assign(answer=answer)


def ask(chain: Runnable[str, dict[str, Any]], question: Question, record: Record) -> None:
    if question.stream:
        result: dict[str, Any] = {"answer": ""}
        for chunk in chain.stream(question.text):
            for key, value in chunk.items():
                if key == "answer":
                    result["answer"] += value
                else:
                    result[key] = value
    else:
        result = chain.invoke(question.text)
    # LangChain's retriever reports no scores
    record.result(answer=result["answer"], docs=[(d.id, None, d.page_content) for d in result["context"]])

// The review page: plain JavaScript, no build step. Every piece of trace text is written with
// textContent (never innerHTML), so answers and chunks holding HTML or script stay inert text, and in
// an element with dir="auto", which isolates it: bidi controls in it (U+202E...) cannot reorder the page.
"use strict";

const API = "/api/v1/review";
let csrf = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") {
      node.textContent = value;
      node.dir = "auto";
    }
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...rest] = part.trim().split("=");
    if (key === name) return decodeURIComponent(rest.join("="));
  }
  return null;
}

async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && csrf) headers["X-CSRF-Token"] = csrf;
  const response = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    window.location.assign("/review/login");
    throw new Error("signed out");
  }
  let data = null;
  try { data = await response.json(); } catch (_) { data = null; }
  return { status: response.status, data };
}

function fmtRate(rate) {
  if (!rate || rate.value === null) return "–";
  const pct = (x) => (100 * x).toFixed(0) + "%";
  return `${pct(rate.value)} [${pct(rate.lower)}, ${pct(rate.upper)}] (${rate.count}/${rate.total})`;
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

function typing(event) {
  const t = event.target;
  return t && (t.tagName === "INPUT" && t.type !== "radio" || t.tagName === "TEXTAREA" || t.tagName === "SELECT");
}

function toggleHelp() {
  const help = document.getElementById("help");
  help.hidden = !help.hidden;
}

async function session() {
  const { data } = await call("GET", `${API}/session`);
  csrf = data.csrf;
  const who = document.getElementById("who");
  if (who) who.textContent = `${data.reviewer} · ${data.tenants.join(", ")}`;
  return data;
}

// -- sign-in ------------------------------------------------------------------------------------

function loginPage() {
  const form = document.getElementById("login-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = document.getElementById("token").value;
    const response = await fetch(`${API}/session`, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": cookie("ragmon_review_login") || "" },
      body: JSON.stringify({ token }),
    });
    if (response.ok) {
      window.location.assign("/review");
    } else {
      const data = await response.json().catch(() => ({}));
      document.getElementById("login-error").textContent =
        response.status === 401 ? "Unknown token." : (data.detail || "Sign-in failed; reload the page.");
    }
  });
}

// -- list ---------------------------------------------------------------------------------------

function filterQuery(form) {
  const params = new URLSearchParams();
  for (const [key, value] of new FormData(form).entries()) if (value) params.set(key, value);
  return params;
}

async function renderProgress() {
  const { data } = await call("GET", `${API}/progress`);
  const body = document.querySelector("#progress tbody");
  body.replaceChildren();
  for (const [queue, counts] of Object.entries(data.queues)) {
    body.append(el("tr", { "data-queue": queue },
      el("td", { text: queue }), el("td", { class: "open", text: String(counts.open) }),
      el("td", { class: "claimed", text: String(counts.claimed) }),
      el("td", { class: "done", text: String(counts.done) }),
      el("td", { class: "age", text: fmtAge(counts.oldest_open_age_s) })));
  }
  const reviewers = document.querySelector("#reviewers tbody");
  reviewers.replaceChildren();
  for (const [name, counts] of Object.entries(data.reviewers)) {
    reviewers.append(el("tr", { "data-reviewer": name }, el("td", { text: name }),
      el("td", { text: String(counts.claimed) }), el("td", { class: "done", text: String(counts.done) })));
  }
}

async function renderCalibration() {
  const { data } = await call("GET", `${API}/calibration`);
  const body = document.querySelector("#calibration tbody");
  body.replaceChildren();
  if (!data.calibration.length) {
    body.append(el("tr", {}, el("td", { colspan: "8", class: "muted", text: "No reviewed judged traces yet." })));
  }
  for (const c of data.calibration) {
    const kappa = c.kappa.value === null ? "–"
      : `${c.kappa.value.toFixed(2)} [${c.kappa.lower.toFixed(2)}, ${c.kappa.upper.toFixed(2)}]`;
    body.append(el("tr", { "data-version": c.judge_version, "data-sample": c.sample },
      el("td", { text: c.judge_version }), el("td", { text: c.sample }),
      el("td", { class: "pairs", text: String(c.pairs) }),
      el("td", { class: "agreement", text: fmtRate(c.agreement) }),
      el("td", { class: "kappa", text: kappa }),
      el("td", { class: "false-approval", text: fmtRate(c.false_approval) }),
      el("td", { class: "false-rejection", text: fmtRate(c.false_rejection) }),
      el("td", { text: String(c.excluded.unsure) })));
  }
}

let selected = 0;

function select(rows, index) {
  if (!rows.length) return;
  selected = Math.max(0, Math.min(rows.length - 1, index));
  rows.forEach((row, i) => row.classList.toggle("selected", i === selected));
  rows[selected].scrollIntoView({ block: "nearest" });
}

async function renderItems(form) {
  const params = filterQuery(form);
  history.replaceState(null, "", `/review?${params}`);
  const { data } = await call("GET", `${API}/items?${params}`);
  const apps = form.elements.app;
  const chosen = apps.value;
  apps.replaceChildren(el("option", { value: "", text: "any" }),
    ...data.apps.map((app) => el("option", { value: app, text: app })));
  apps.value = chosen;
  const body = document.querySelector("#items tbody");
  body.replaceChildren();
  for (const item of data.items) {
    const href = `/review/items/${item.id}?${params}`;
    const row = el("tr", { "data-id": String(item.id), "data-href": href, class: `state-${item.state}` },
      el("td", {}, el("a", { href, text: String(item.id) })),
      el("td", { text: item.queue }), el("td", { text: item.app }),
      el("td", { text: item.reasons.map((r) => r.reason).join(", ") }),
      el("td", { text: item.diagnosis || "–" }),
      el("td", { text: item.state + (item.reviewer ? ` (${item.reviewer})` : "") }),
      el("td", { text: new Date(item.created_at).toLocaleString() }));
    row.addEventListener("click", (event) => {
      if (event.target.tagName !== "A") window.location.assign(href);
    });
    body.append(row);
  }
  document.getElementById("empty").hidden = data.items.length > 0;
  select([...body.rows], 0);
}

async function claimNext(form) {
  const params = filterQuery(form);
  params.delete("state");
  const { data } = await call("POST", `${API}/next?${params}`);
  if (data && data.item) window.location.assign(`/review/items/${data.item.id}?${filterQuery(form)}`);
  else document.getElementById("empty").hidden = false;
}

async function listPage() {
  await session();
  const form = document.getElementById("filters");
  const given = new URLSearchParams(window.location.search);
  for (const [key, value] of given.entries()) if (form.elements[key]) form.elements[key].value = value;
  if (given.has("app")) form.elements.app.append(el("option", { value: given.get("app"), text: given.get("app") }));
  if (given.has("app")) form.elements.app.value = given.get("app");
  form.addEventListener("change", () => renderItems(form));
  document.getElementById("start").addEventListener("click", () => claimNext(form));
  document.getElementById("sign-out").addEventListener("click", async () => {
    await call("DELETE", `${API}/session`);
    window.location.assign("/review/login");
  });
  // keys work as soon as the rows are there, not only once progress and calibration have loaded
  document.addEventListener("keydown", (event) => {
    if (typing(event) || event.ctrlKey || event.metaKey || event.altKey) return;
    const rows = [...document.querySelectorAll("#items tbody tr")];
    if (event.key === "j") select(rows, selected + 1);
    else if (event.key === "k") select(rows, selected - 1);
    else if ((event.key === "Enter" || event.key === "o") && rows[selected]) {
      window.location.assign(rows[selected].dataset.href);
    } else if (event.key === "n") claimNext(form);
    else if (event.key === "?") toggleHelp();
    else return;
    event.preventDefault();
  });
  await Promise.all([renderItems(form), renderProgress(), renderCalibration()]);
}

// -- item ---------------------------------------------------------------------------------------

function chunkRows(table, chunks, form) {
  const body = table.querySelector("tbody");
  body.replaceChildren();
  for (const chunk of chunks) {
    const add = el("button", { type: "button", class: "link", title: "add to expected chunk ids", text: "+ expected" });
    add.addEventListener("click", () => {
      const field = form.elements.expected_chunk_ids;
      const ids = field.value.split(",").map((s) => s.trim()).filter(Boolean);
      if (!ids.includes(chunk.id)) ids.push(chunk.id);
      field.value = ids.join(", ");
    });
    body.append(el("tr", { "data-chunk": chunk.id },
      el("td", { text: String(chunk.rank) }), el("td", { class: "mono", text: chunk.id }),
      el("td", { text: chunk.score === null ? "–" : Number(chunk.score).toFixed(3) }),
      el("td", { class: "text chunk-content", text: chunk.content === null ? "(content not sent)" : chunk.content }),
      el("td", {}, add)));
  }
}

function renderJudgment(detail) {
  const box = document.getElementById("judgment");
  box.replaceChildren();
  if (detail.judge_hidden) {
    box.append(el("p", { class: "muted", text: "Hidden: this item is in the blind calibration sample. Record your verdict first; the judge's is shown afterwards." }));
    return;
  }
  const j = detail.judgment;
  if (!j) {
    box.append(el("p", { class: "muted", text: "Not judged." }));
    return;
  }
  const verdict = j.outcome === "scored" ? (j.claims.some((c) => !c.supported) ? "unfaithful" : "faithful") : j.outcome;
  const facts = el("dl", { class: "facts" },
    el("dt", { text: "verdict" }), el("dd", { id: "judge-verdict", class: `verdict-${verdict}`, text: verdict }),
    el("dt", { text: "faithfulness" }), el("dd", { text: j.faithfulness === null ? "–" : j.faithfulness.toFixed(2) }),
    el("dt", { text: "diagnosis" }), el("dd", { id: "judge-diagnosis", text: j.diagnosis || "–" }),
    el("dt", { text: "failure mode" }), el("dd", { text: j.failure_mode || j.failure_reason || "–" }),
    el("dt", { text: "judge" }), el("dd", { text: `${j.judge} ${j.judge_version}${j.judge_model ? " · " + j.judge_model : ""}` }),
    el("dt", { text: "rationale" }), el("dd", { id: "judge-rationale", class: "text", text: j.rationale || "–" }));
  const claims = el("ol", { id: "claims", class: "claims", start: "0" });
  for (const claim of j.claims) {
    claims.append(el("li", { class: `claim ${claim.supported ? "supported" : "unsupported"}` },
      el("span", { class: "badge", text: claim.supported ? "supported" : "unsupported" }), " ", claim.text));
  }
  box.append(facts, claims);
}

function renderAnswer(detail) {
  const answer = document.getElementById("answer");
  answer.replaceChildren();
  const text = detail.trace ? detail.trace.answer : null;
  if (text === null || text === undefined) {
    answer.append(el("span", { class: "muted", text: "(no answer)" }));
    return;
  }
  const segments = detail.judgment ? detail.judgment.answer_segments : [{ text, claim: null }];
  for (const seg of segments) {
    if (seg.claim === null) answer.append(document.createTextNode(seg.text));
    else answer.append(el("mark", { class: `claim ${seg.supported ? "supported" : "unsupported"}`, "data-claim": String(seg.claim), text: seg.text }));
  }
}

function renderClaimMarks(detail) {
  const claims = detail.claims_to_label || [];
  const list = document.getElementById("claim-list");
  list.replaceChildren();
  document.getElementById("claim-marks").hidden = claims.length === 0;
  for (const claim of claims) {
    const choice = el("select", { name: `claim-${claim.index}`, "data-claim-mark": String(claim.index) },
      el("option", { value: "", text: "—" }),
      el("option", { value: "supported", text: "supported" }),
      el("option", { value: "unsupported", text: "unsupported" }));
    list.append(el("li", {}, choice, " ", el("span", { class: "text", text: claim.text })));
  }
}

// null when no claim is marked; the marks in order when every claim is; a string saying what is missing
function claimMarks() {
  const choices = [...document.querySelectorAll("select[data-claim-mark]")];
  const marked = choices.filter((c) => c.value !== "");
  if (marked.length === 0) return null;
  if (marked.length < choices.length) return `Mark every claim, or none (${marked.length} of ${choices.length} marked).`;
  return choices.map((c) => c.value === "supported");
}

function renderReview(review) {
  const view = document.getElementById("review-view");
  view.replaceChildren();
  for (const [key, value] of Object.entries(review)) {
    const shown = Array.isArray(value) ? value.join(", ") : value;
    view.append(el("dt", { text: key.replaceAll("_", " ") }), el("dd", { class: "text", text: shown === null || shown === "" ? "–" : String(shown) }));
  }
  document.getElementById("done-review").hidden = false;
  document.getElementById("review-form").hidden = true;
}

function setStatus(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = `status ${kind || ""}`;
}

async function itemPage() {
  await session();
  const id = window.location.pathname.split("/").pop();
  const query = window.location.search;
  const form = document.getElementById("review-form");
  const { status, data: detail } = await call("GET", `${API}/items/${id}${query}`);
  if (status !== 200) {
    setStatus("Not found.", "error");
    return;
  }
  const item = detail.item;
  const trace = detail.trace;
  document.getElementById("meta").textContent =
    `#${item.id} · ${item.queue} · ${item.app} · trace ${item.trace_id} · reasons: ` +
    item.reasons.map((r) => r.detail ? `${r.reason} (${r.detail})` : r.reason).join("; ");
  document.getElementById("question").textContent = trace ? (trace.query || "(no question)") : "(trace not stored)";
  renderAnswer(detail);
  document.getElementById("legend").hidden = !detail.judgment;
  renderJudgment(detail);
  renderClaimMarks(detail);
  chunkRows(document.getElementById("chunks"), trace ? trace.chunks : [], form);
  if (trace && trace.reranked.length) {
    document.getElementById("reranked-section").hidden = false;
    chunkRows(document.getElementById("reranked"), trace.reranked, form);
  }
  const go = (target) => { if (target) window.location.assign(`/review/items/${target}${query}`); };
  const back = () => window.location.assign(`/review${query}`);

  // The buttons work from the moment the item shows: a release clicked while the claim is still
  // in flight waits for it, so the claim cannot land after the release and hold the item.
  let held = false;
  let claiming = Promise.resolve();
  if (detail.review) {
    renderReview(detail.review);
  } else {
    claiming = claimItem();
  }
  async function claimItem() {
    const claim = await call("POST", `${API}/items/${id}/claim`);
    if (claim.status === 200) {
      held = true;
      document.getElementById("lease").textContent = `claimed by you until ${new Date(claim.data.lease_until).toLocaleTimeString()}`;
    } else {
      const who = claim.data && claim.data.reviewer ? ` by ${claim.data.reviewer}` : "";
      const until = claim.data && claim.data.lease_until ? ` until ${new Date(claim.data.lease_until).toLocaleTimeString()}` : "";
      setStatus(`Claimed${who}${until}: you cannot review it now.`, "error");
      for (const field of form.elements) field.disabled = true;
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!held) return;
    const values = new FormData(form);
    const verdict = values.get("verdict");
    if (!verdict) {
      setStatus("Choose a verdict first (f, u or s).", "error");
      return;
    }
    const marks = claimMarks();
    if (typeof marks === "string") {
      setStatus(marks, "error");
      return;
    }
    const body = {
      verdict,
      claims_supported: marks,
      failure_mode: values.get("failure_mode") || null,
      expected_chunk_ids: String(values.get("expected_chunk_ids") || "").split(",").map((s) => s.trim()).filter(Boolean),
      reference_answer: values.get("reference_answer") || null,
      category: values.get("category") || null,
      expected_behaviour: values.get("expected_behaviour") || "answer",
      note: values.get("note") || null,
    };
    const result = await call("POST", `${API}/items/${id}/review`, body);
    if (result.status === 201 || result.status === 200) {
      held = false;
      setStatus("Saved.", "ok");
      if (detail.next_id) go(detail.next_id);
      else window.location.reload();
    } else {
      setStatus(result.data && result.data.detail ? String(result.data.detail) : `Not saved (${result.status}).`, "error");
    }
  });
  document.getElementById("release").addEventListener("click", async () => {
    await claiming;
    if (held) await call("POST", `${API}/items/${id}/release`);
    back();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      if (typing(event)) event.target.blur();
      else back();
      return;
    }
    if (typing(event)) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const verdicts = { f: "faithful", u: "unfaithful", s: "unsure" };
    if (verdicts[event.key] && held) {
      form.querySelector(`input[name=verdict][value=${verdicts[event.key]}]`).checked = true;
    } else if (event.key === "Enter" && event.target.tagName !== "BUTTON" && event.target.tagName !== "A") {
      form.requestSubmit();
    } else if (event.key === "j") go(detail.next_id);
    else if (event.key === "k") go(detail.prev_id);
    else if (event.key === "?") toggleHelp();
    else return;
    event.preventDefault();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "login") loginPage();
  else if (page === "list") listPage();
  else if (page === "item") itemPage();
});

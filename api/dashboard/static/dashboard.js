// fsdp-planner dashboard: small progressive enhancements. Every page works without this file.
"use strict";

document.documentElement.classList.add("js");

// Plans list: the Compare button is enabled once two or more plans are ticked.
function setUpCompare() {
  const button = document.getElementById("compare-button");
  const hint = document.getElementById("compare-hint");
  if (!button) return;
  const boxes = Array.from(document.querySelectorAll('input[type="checkbox"][form="compare-form"]'));
  const update = () => {
    const ticked = boxes.filter((box) => box.checked).length;
    button.disabled = ticked < 2;
    button.textContent = ticked >= 2 ? `Compare ${ticked} plans` : "Compare selected";
    if (hint) hint.hidden = ticked >= 2;
  };
  boxes.forEach((box) => box.addEventListener("change", update));
  update();
}

// New plan: show only the model input of the chosen source; say how many sequences a batch holds.
function setUpPlanForm() {
  const form = document.getElementById("plan-form");
  if (!form) return;
  const radios = Array.from(form.querySelectorAll('input[name="model_source"]'));
  const showSource = () => {
    const chosen = (radios.find((radio) => radio.checked) || {}).value || "catalog";
    form.querySelectorAll(".field[data-source]").forEach((field) => {
      field.classList.toggle("source-hidden", field.dataset.source !== chosen);
    });
  };
  radios.forEach((radio) => radio.addEventListener("change", showSource));
  showSource();

  // The line under the batch: at once, how many sequences it holds; then the planner's own word on it
  // (POST /plans/new/batch-hint: whether it splits over this cluster's data-parallel ranks, and the
  // batches near it that plan there), so that the hint and a refused submission name the same batches.
  const seqLen = document.getElementById("seq_len");
  const batch = document.getElementById("global_batch_tokens");
  const output = document.getElementById("batch-sequences");
  if (!seqLen || !batch || !output) return;
  let timer = null;
  let asked = 0;
  const askPlanner = async (arithmetic) => {
    const question = ++asked;
    let text = "";
    try {
      const response = await fetch("/plans/new/batch-hint", {
        method: "POST", body: new FormData(form), headers: { Accept: "text/plain" },
      });
      text = response.ok ? await response.text() : "";
    } catch (error) {
      // Offline or refused: the arithmetic stays, and a submission says the rest.
    }
    if (question === asked) output.textContent = text || arithmetic;
  };
  const describeBatch = () => {
    const seq = Number(seqLen.value);
    const tokens = Number(batch.value);
    clearTimeout(timer);
    asked++;  // an answer to an earlier question is stale now
    if (!(seq > 0 && tokens > 0)) {
      output.textContent = "";
      return;
    }
    const whole = tokens % seq === 0;
    const arithmetic = whole
      ? `= ${(tokens / seq).toLocaleString()} sequences per step.`
      : `Not a multiple of ${seq.toLocaleString()}.`;
    output.textContent = whole ? arithmetic : `${arithmetic} Asking the planner which batches plan on this cluster…`;
    timer = setTimeout(() => askPlanner(arithmetic), 300);
  };
  form.addEventListener("input", describeBatch);
  form.addEventListener("change", describeBatch);
  describeBatch();

  sayWhileSubmitting(form, "create-plan", "Searching configurations…");
}

// Planning takes a moment (a study plans every cluster): say so, and keep a double click from sending twice.
function sayWhileSubmitting(form, buttonId, message) {
  form.addEventListener("submit", () => {
    const button = document.getElementById(buttonId);
    const status = document.getElementById("planning-status");
    if (button) button.disabled = true;
    if (status) status.textContent = message;
  });
}

function setUpStudyForm() {
  const form = document.getElementById("study-form");
  if (form) sayWhileSubmitting(form, "create-study", "Queueing the study…");
}

// A queued or running study: follow its job through the API, then show the result (a reload).
const STUDY_POLL_MS = 1000;
// As the server's `dollars` filter writes costs: $1.23K, $87.4M.
const DOLLARS = new Intl.NumberFormat("en-US", {
  style: "currency", currency: "USD", notation: "compact", maximumSignificantDigits: 3,
});

function setUpStudyJob() {
  const job = document.getElementById("study-job");
  if (!job || !["queued", "running"].includes(job.dataset.state)) return;
  const bar = document.getElementById("study-progress");
  const done = document.getElementById("study-done");
  const fitting = document.getElementById("study-fitting");
  const best = document.getElementById("study-best");
  const title = document.getElementById("job-title");
  const poll = async () => {
    let study;
    try {
      const response = await fetch(`/api/v1/studies/${job.dataset.studyId}`, { headers: { Accept: "application/json" } });
      if (response.status === 404) { window.location.reload(); return; }
      if (!response.ok) throw new Error(String(response.status));
      study = await response.json();
    } catch (error) {
      window.setTimeout(poll, STUDY_POLL_MS * 3); // the server restarts, or the network blinks: try again
      return;
    }
    if (!["queued", "running"].includes(study.state)) { window.location.reload(); return; }
    if (study.state === "running" && title) title.textContent = "Planning every cluster";
    bar.max = study.num_candidates;
    bar.value = study.candidates_done;
    bar.textContent = `${study.candidates_done} of ${study.num_candidates}`;
    done.textContent = study.candidates_done.toLocaleString();
    fitting.textContent = study.num_fitting.toLocaleString();
    const cheapest = study.best_so_far;
    best.textContent = cheapest && cheapest.cost != null
      ? ` · cheapest so far: ${cheapest.num_nodes}x${cheapest.gpus_per_node}x${cheapest.gpu}, ${DOLLARS.format(cheapest.cost)}`
      : "";
    window.setTimeout(poll, STUDY_POLL_MS);
  };
  window.setTimeout(poll, STUDY_POLL_MS);
}

// A queued or running plan job (a re-plan, a large plan search): poll the API; once it has finished, a
// reload lets the server lead to the plan (or show why there is none).
function setUpPlanJob() {
  const job = document.getElementById("plan-job");
  if (!job || !["queued", "running"].includes(job.dataset.state)) return;
  const state = document.getElementById("plan-job-state");
  const title = document.getElementById("job-title");
  const poll = async () => {
    let answer;
    try {
      const response = await fetch(`/api/v1/plan-jobs/${job.dataset.planJobId}`, { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(String(response.status));
      answer = await response.json();
    } catch (error) {
      window.setTimeout(poll, STUDY_POLL_MS * 3);
      return;
    }
    if (!["queued", "running"].includes(answer.state)) { window.location.reload(); return; }
    if (state) state.textContent = answer.state;
    if (answer.state === "running" && title) title.textContent = "Searching";
    window.setTimeout(poll, STUDY_POLL_MS / 2);
  };
  window.setTimeout(poll, STUDY_POLL_MS / 2);
}

document.addEventListener("DOMContentLoaded", () => {
  setUpPlanJob();
  setUpCompare();
  setUpPlanForm();
  setUpStudyForm();
  setUpStudyJob();
});

// Coming back to the form with the back button restores the page as it was left: re-enable its button.
window.addEventListener("pageshow", () => {
  ["create-plan", "create-study"].forEach((id) => {
    const button = document.getElementById(id);
    if (button) button.disabled = false;
  });
});

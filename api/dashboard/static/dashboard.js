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
  if (form) sayWhileSubmitting(form, "create-study", "Planning every cluster…");
}

document.addEventListener("DOMContentLoaded", () => {
  setUpCompare();
  setUpPlanForm();
  setUpStudyForm();
});

// Coming back to the form with the back button restores the page as it was left: re-enable its button.
window.addEventListener("pageshow", () => {
  ["create-plan", "create-study"].forEach((id) => {
    const button = document.getElementById(id);
    if (button) button.disabled = false;
  });
});

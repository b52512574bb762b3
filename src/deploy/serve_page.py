"""serve.py's page (``GET /``): one self-contained HTML file (inline CSS and JavaScript, no
request but to the server itself) to drop or choose images, send them to ``POST /predict`` and
show each answer: the top classes with their probabilities, a multi-label model's labels, and
the Grad-CAM overlay where the model file allows it (else the page says why). Text from the
model (class names) is set as text, never as HTML. See docs/serving.md#the-page.
"""
import html
import json
import os
import re

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>__TITLE__</title>
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: .2em; } .sub { color: #555; margin-top: 0; }
#drop { border: 2px dashed #888; border-radius: 8px; padding: 2em; text-align: center;
        background: #fafafa; cursor: pointer; }
#drop.over { background: #e8f0fe; border-color: #1a73e8; }
#status { margin: 1em 0; min-height: 1.4em; } .error { color: #b00020; }
.answer { display: flex; gap: 1.5em; border-top: 1px solid #ddd; padding: 1em 0; }
.answer img { width: 224px; height: 224px; object-fit: contain; background: #eee; }
table { border-collapse: collapse; } td { padding: 2px 8px; }
td.p { text-align: right; font-variant-numeric: tabular-nums; }
.bar { height: 10px; background: #1a73e8; border-radius: 2px; }
.labels { margin: .3em 0 .6em; } .note { color: #555; font-size: .9em; }
</style></head>
<body>
<h1>__TITLE__</h1>
<p class="sub">__SUBTITLE__</p>
<div id="drop">Drop images here, or <label><u>choose files</u>
<input id="file" type="file" accept="image/*" multiple hidden></label></div>
<p><label><input id="cam" type="checkbox" __CAM_STATE__> Grad-CAM overlay</label>
<span id="cam-note" class="note">__CAM_NOTE__</span></p>
<div id="status">checking the model...</div>
<div id="results"></div>
<script type="application/json" id="metadata">__METADATA__</script>
<script>
"use strict";
const meta = JSON.parse(document.getElementById("metadata").textContent);
const status = document.getElementById("status");
const results = document.getElementById("results");
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}
function say(text, isError) {
  status.textContent = text;
  status.className = isError ? "error" : "";
}
async function health() {
  try {
    const answer = await (await fetch("/health")).json();
    say(answer.status === "ready" ? "ready" : "model " + answer.status +
        (answer.error ? ": " + answer.error : ""), answer.status === "failed");
    if (answer.status === "loading") setTimeout(health, 1000);
  } catch (err) { say("server not reachable: " + err, true); }
}
function classTable(entries) {
  const table = el("table");
  for (const entry of entries) {
    const row = table.insertRow();
    row.className = "top-row";
    row.dataset.class = entry.class;
    row.dataset.probability = entry.probability;
    row.insertCell().textContent = entry.name;
    const cell = row.insertCell();
    cell.className = "p";
    cell.textContent = (100 * entry.probability).toFixed(2) + "%";
    const bar = el("div", undefined, "bar");
    bar.style.width = Math.max(1, Math.round(160 * entry.probability)) + "px";
    row.insertCell().appendChild(bar);
  }
  return table;
}
function show(file, answer) {
  const box = el("div", undefined, "answer");
  box.dataset.image = answer.image;
  const picture = el("img");
  picture.alt = answer.image;
  picture.src = answer.cam || URL.createObjectURL(file);
  if (answer.cam) picture.className = "cam";
  box.appendChild(picture);
  const text = el("div");
  text.appendChild(el("strong", answer.image));
  if (answer.labels) {
    text.appendChild(el("div", "labels above their thresholds: " +
      (answer.labels.map(l => l.name).join(", ") || "none"), "labels"));
  }
  text.appendChild(classTable(answer.top));
  box.appendChild(text);
  results.prepend(box);
}
async function send(files) {
  if (!files.length) return;
  const form = new FormData();
  for (const file of files) form.append("image", file, file.name);
  const cam = document.getElementById("cam").checked;
  say("predicting " + files.length + " image" + (files.length > 1 ? "s" : "") + "...");
  try {
    const response = await fetch("/predict?cam=" + cam, { method: "POST", body: form });
    const answer = await response.json();
    if (!response.ok) { say(answer.error.kind + ": " + answer.error.message, true); return; }
    answer.predictions.forEach((prediction, i) => show(files[i], prediction));
    say("done: " + answer.predictions.length + " answered");
  } catch (err) { say("request failed: " + err, true); }
}
const drop = document.getElementById("drop");
const input = document.getElementById("file");
drop.addEventListener("click", event => { if (event.target === drop) input.click(); });
input.addEventListener("change", () => { send(Array.from(input.files)); input.value = ""; });
drop.addEventListener("dragover", event => { event.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", event => {
  event.preventDefault(); drop.classList.remove("over");
  send(Array.from(event.dataTransfer.files));
});
health();
</script>
</body></html>
"""


def page_html(metadata: dict) -> str:
    """The page for a server whose ``/metadata`` is ``metadata`` (names and notes escaped;
    the metadata embedded as JSON for the script)."""
    record = metadata.get("model_record") or {}
    title = f"{record.get('net_name') or 'model'}: " \
            f"{os.path.basename(metadata.get('model_file', '').rstrip('/'))}"
    classes = record.get("class_num")
    subtitle = (f"{record.get('task') or 'multiclass'}, {classes} classes, runtime "
                f"{metadata.get('runtime', '?')}; answers as predict.py prints them")
    note = metadata.get("cam_note")
    embedded = json.dumps(metadata).replace("<", "\\u003c").replace(">", "\\u003e")
    values = {"TITLE": html.escape(title), "SUBTITLE": html.escape(subtitle),
              "CAM_STATE": "disabled" if note else "",
              "CAM_NOTE": html.escape(f"not for this model file: {note}") if note else
              "the class shown first, on the image as the network saw it",
              "METADATA": embedded}
    return re.sub(r"__([A-Z_]+)__", lambda match: values[match.group(1)], PAGE)

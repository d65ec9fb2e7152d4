"""The report's trajectories page (`<run folder>/report/trajectories.html`): what the agent did.

Reads the run's `trajectories.jsonl` (written by the loop, rl360cli/loop/samples.py: each step's best,
worst, masked and a few random sessions, the conversation as the model saw it) and writes one
self-contained page: the samples embedded as JSON, a small script that renders them with `textContent`
only (model text may hold `<script>`: it is shown, never run), a task search box and an outcome filter
that work in the page, no network. `?q=TASK&outcome=ok|model_failure|infra_failure` in the URL sets
them. The newest steps come first; a page holds the newest steps whose text fits `MAX_PAGE_CHARS`, the
older ones stay in trajectories.jsonl. A running run's file may end in a line being written: lines
that do not read are left out and counted. Tested in tests/cli/test_report_trajectories.py.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rl360cli.loop.samples import TRAJECTORIES

PAGE = "trajectories.html"
# The text a page embeds at most (its steps are the newest that fit; one step always).
MAX_PAGE_CHARS = 40_000_000
# How many samples the page renders at first, and how many more each "show more" adds.
PAGE_SIZE = 40
_STEP = re.compile(rb'^\{"step": (\d+)')


@dataclass(frozen=True, kw_only=True, slots=True)
class Kept:
    """What trajectories.jsonl holds, as far as a page shows it."""

    samples: list[dict]
    # The samples on the page: newest step first, in the loop's order within a step (best, worst, masked, random).
    found: bool
    # Whether the run folder has a trajectories.jsonl at all (a run from before it, or one with no step yet).
    num_steps_left_out: int = 0
    # Older steps whose samples did not fit the page (they are in trajectories.jsonl).
    num_unreadable: int = 0
    # Lines that were not JSON (the line a running trainer is writing).

    def steps(self) -> list[int]:
        return sorted({s["step"] for s in self.samples})

    def describe(self) -> str:
        """One line for the run's page: how many samples of which steps."""
        if not self.samples:
            return ("no samples kept yet: the loop keeps some from its first step" if self.found
                    else f"none: the run folder has no {TRAJECTORIES}")
        steps = self.steps()
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        older = f" ({self.num_steps_left_out} older steps only in {TRAJECTORIES})" if self.num_steps_left_out else ""
        return f"{len(self.samples)} samples of {span}: the best, the worst, the masked and a random few{older}"


def read_kept(path: Path, *, max_chars: int = MAX_PAGE_CHARS) -> Kept:
    """The newest steps' samples of `path` whose lines fit `max_chars` (one step at least)."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return Kept(samples=[], found=False)
    taken: list[tuple[int, int, dict]] = []
    size, unreadable, last_step, older = 0, 0, None, set()
    for index in range(len(lines) - 1, -1, -1):
        raw = lines[index]
        if not raw.strip():
            continue
        if older or (size > max_chars and _line_step(raw) != last_step):
            step = _line_step(raw)
            if step is not None:
                older.add(step)
            continue
        try:
            row = json.loads(raw)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError):
            unreadable += 1
            continue
        taken.append((step, index, row))
        size += len(raw)
        last_step = step
    taken.sort(key=lambda item: (-item[0], item[1]))
    return Kept(samples=[row for _, _, row in taken], found=True, num_steps_left_out=len(older),
                num_unreadable=unreadable)


def _line_step(raw: bytes) -> int | None:
    match = _STEP.match(raw)
    return int(match.group(1)) if match else None


def write_trajectories(run_dir: Path, folder: Path, run_id: str, *, active: bool) -> Kept:
    """Write `folder`/trajectories.html from the run's trajectories.jsonl; what it shows."""
    kept = read_kept(run_dir / TRAJECTORIES)
    page = folder / PAGE
    staging = folder / f".{PAGE}.tmp"
    staging.write_text(render_trajectories(run_id, kept, source=str(run_dir / TRAJECTORIES), active=active),
                       encoding="utf-8")
    staging.replace(page)
    return kept


def embedded_json(value: object) -> str:
    """`value` as JSON that can sit inside a `<script type="application/json">` element: no `<`, `>` or `&`
    survives to close the element or open a comment."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1340px; color: #1f2328; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } .note { color: #59636e; margin: 4px 0; }
.controls { position: sticky; top: 0; background: #fff; padding: 10px 0; border-bottom: 1px solid #d1d9e0;
  display: flex; gap: 12px; align-items: center; z-index: 1; }
.controls input { font: inherit; padding: 4px 8px; width: 320px; } .controls select { font: inherit; padding: 3px; }
details.sample { border: 1px solid #d1d9e0; border-radius: 6px; margin: 12px 0; padding: 0 10px 8px; }
details.sample > summary { cursor: pointer; padding: 8px 0; font-weight: 600; }
.badge { display: inline-block; color: #fff; border-radius: 4px; padding: 0 7px; font-weight: 600; font-size: 12.5px; }
.ok { background: #1a7f37; } .model_failure { background: #9a6700; } .infra_failure { background: #cf222e; }
.why { color: #59636e; font-weight: 400; } .meta { color: #59636e; font-size: 12.5px; margin: 2px 0; }
.rewritten { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 4px; padding: 4px 8px; margin: 6px 0; }
.span { margin: 6px 0; border-left: 4px solid #d1d9e0; padding-left: 8px; }
.span.model { border-left-color: #0969da; } .span.model pre { background: #ddf4ff; }
.who { font-size: 12px; color: #59636e; font-weight: 600; }
pre { background: #f6f8fa; padding: 8px; border-radius: 6px; overflow: auto; font-size: 12px; max-height: 480px;
  white-space: pre-wrap; overflow-wrap: anywhere; margin: 2px 0; }
mark.call { background: #fff1a8; outline: 1px solid #d4a72c; border-radius: 3px; }
.tok { color: #8c959f; } .cut { color: #cf222e; font-size: 12px; } button { font: inherit; margin: 12px 0; }
footer { margin-top: 28px; color: #59636e; font-size: 12.5px; }
"""

SCRIPT = r"""
(function () {
  var samples = JSON.parse(document.getElementById("samples").textContent);
  var list = document.getElementById("list"), q = document.getElementById("q"),
      outcome = document.getElementById("outcome"), count = document.getElementById("count"),
      more = document.getElementById("more");
  var PAGE = parseInt(document.body.dataset.pageSize, 10), limit = PAGE;
  var params = new URLSearchParams(location.search);
  q.value = params.get("q") || "";
  outcome.value = params.get("outcome") || "all";
  // What to highlight: a tool call, a shell block, and the chat template's special tokens (dimmed).
  var MARKS = /(<tool_call>[\s\S]*?(?:<\/tool_call>|$))|(```(?:bash|sh|shell|mswea_bash_command)?[ \t]*\n[\s\S]*?(?:```|$))|(<\|[^|\s<>]{1,40}\|>)/g;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function marked(text, calls) {
    var pre = el("pre"), last = 0, m;
    MARKS.lastIndex = 0;
    while ((m = MARKS.exec(text)) !== null) {
      if (m[0].length === 0) { MARKS.lastIndex++; continue; }
      pre.appendChild(document.createTextNode(text.slice(last, m.index)));
      pre.appendChild(m[3] !== undefined || !calls ? el("span", m[3] !== undefined ? "tok" : "", m[0])
                                                    : el("mark", "call", m[0]));
      last = m.index + m[0].length;
    }
    pre.appendChild(document.createTextNode(text.slice(last)));
    return pre;
  }
  function turnsOf(s) {
    return (s.turns || []).filter(function (t) { return t.segment === undefined || t.segment === s.segment; });
  }
  function describeTurn(t) {
    if (!t) { return ""; }
    var parts = [];
    if (t.action) { parts.push(t.action); }
    if (t.finish) { parts.push("finish " + t.finish); }
    if (t.tool_calls && t.tool_calls.length) { parts.push("calls " + t.tool_calls.join(", ")); }
    if (t.format_error) { parts.push("format error: " + t.format_error); }
    return parts.length ? " · " + parts.join(" · ") : "";
  }
  function conversation(s) {
    var box = el("div", "conversation"), turns = turnsOf(s), turn = 0;
    if (!s.spans || !s.spans.length) { box.appendChild(el("p", "meta", "no tokens: the session ended before the model was asked")); }
    (s.spans || []).forEach(function (span, i) {
      var div = el("div", "span " + span.by), who;
      if (span.by === "model") {
        who = "model · turn " + (turn + 1) + " · policy v" + (span.version === null || span.version === undefined ? "?" : span.version)
              + describeTurn(turns[turn]);
        turn++;
      } else {
        who = i === 0 ? "prompt (as the chat template rendered it)" : "environment (tool output / messages appended)";
      }
      div.appendChild(el("div", "who", who));
      div.appendChild(marked(span.text, span.by === "model"));
      if (span.cut) { div.appendChild(el("div", "cut", span.cut + " characters left out of the middle")); }
      box.appendChild(div);
    });
    return box;
  }
  function card(s) {
    var d = el("details", "sample"), sum = el("summary");
    d.open = true;
    d.dataset.task = s.task; d.dataset.outcome = s.outcome; d.dataset.step = s.step;
    sum.appendChild(document.createTextNode("step " + s.step + " · " + s.task + " "));
    sum.appendChild(el("span", "badge " + s.outcome, s.outcome + (s.cause ? ": " + s.cause : "")));
    sum.appendChild(document.createTextNode(" reward " + (s.reward === null ? "none (masked)" : Number(s.reward).toFixed(3))
      + " · " + (s.harness || "harness not recorded") + " · versions " + ((s.versions || []).join(", ") || "none")
      + (s.segments > 1 ? " · segment " + s.segment + " of " + s.segments : "") + " "));
    sum.appendChild(el("span", "why", "(" + s.chosen + ")"));
    d.appendChild(sum);
    var ses = s.session || {}, facts = ["group " + s.group + ", sample " + s.sample, s.num_tokens + " tokens"];
    ["turns", "segments", "tito_breaks", "format_errors", "engine_errors", "endpoint_errors"].forEach(function (k) {
      if (ses[k] !== undefined) { facts.push(k.replace("_", " ") + " " + ses[k]); }
    });
    if (s.node) { facts.push("node " + s.node); }
    if (s.injected) { facts.push("injected failure"); }
    d.appendChild(el("div", "meta", facts.join(" · ")));
    if (s.detail) { d.appendChild(el("div", "meta", "detail: " + s.detail)); }
    if (s.steps && s.steps.length) { d.appendChild(el("div", "meta", "steps: " + JSON.stringify(s.steps))); }
    if (s.segment > 0) {
      d.appendChild(el("div", "rewritten", "segment " + s.segment + " of " + s.segments + ": the harness rewrote its "
        + "history (a tito break), so this segment starts a new conversation; it trains with the session's reward"));
    } else if (s.segments > 1) {
      d.appendChild(el("div", "rewritten", "segment 0 of " + s.segments + ": the harness rewrote its history after it"));
    }
    d.appendChild(conversation(s));
    return d;
  }
  function matches(s) {
    var needle = q.value.trim().toLowerCase();
    return (!needle || String(s.task).toLowerCase().indexOf(needle) >= 0)
      && (outcome.value === "all" || s.outcome === outcome.value);
  }
  function render() {
    var shown = samples.filter(matches), frag = document.createDocumentFragment();
    shown.slice(0, limit).forEach(function (s) { frag.appendChild(card(s)); });
    list.replaceChildren(frag);
    var n = Math.min(limit, shown.length);
    count.textContent = "showing " + n + " of " + shown.length + " matching samples (" + samples.length + " on this page)";
    document.body.dataset.shown = n;
    document.body.dataset.matching = shown.length;
    more.hidden = shown.length <= limit;
  }
  function changed() {
    limit = PAGE;
    var p = new URLSearchParams();
    if (q.value) { p.set("q", q.value); }
    if (outcome.value !== "all") { p.set("outcome", outcome.value); }
    try { history.replaceState(null, "", location.pathname + (p.toString() ? "?" + p : "")); } catch (e) { /* file:// */ }
    render();
  }
  q.addEventListener("input", changed);
  outcome.addEventListener("change", changed);
  more.addEventListener("click", function () { limit += PAGE; render(); });
  render();
  document.body.dataset.rendered = "1";
})();
"""


def render_trajectories(run_id: str, kept: Kept, *, source: str, active: bool) -> str:
    e = html.escape
    written = datetime.now(timezone.utc).isoformat(timespec="seconds")
    snapshot = (" The run goes on: this page is a snapshot; run <code>rl360 report</code> again to refresh it."
                if active else "")
    unreadable = f" {kept.num_unreadable} lines did not read (one being written) and are left out." \
        if kept.num_unreadable else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rl360 run {e(run_id)}: trajectories</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>
<body data-page-size="{PAGE_SIZE}" data-samples="{len(kept.samples)}">
<h1>rl360 run {e(run_id)}: what the agent did</h1>
<p class="note">{e(kept.describe())}. <a href="report.html">The run's page</a>.</p>
<p class="note">Each sample is the conversation as the model saw it, token for token: the prompt and the
messages appended between turns (grey edge) and the model's own text (blue edge, its policy version above
it); tool calls and shell blocks are highlighted, the chat template's special tokens dimmed.</p>
<div class="controls"><input id="q" type="search" placeholder="task id contains..." aria-label="task">
<select id="outcome" aria-label="outcome"><option value="all">all outcomes</option><option value="ok">ok</option>
<option value="model_failure">model failure</option><option value="infra_failure">infra failure</option></select>
<span id="count" class="note"></span></div>
<div id="list"></div><button id="more" type="button" hidden>show more</button>
<footer>Written {e(written)} by <code>rl360 report</code> from {e(source)}.{unreadable}{snapshot}</footer>
<script id="samples" type="application/json">{embedded_json(kept.samples)}</script>
<script>{SCRIPT}</script>
</body></html>
"""

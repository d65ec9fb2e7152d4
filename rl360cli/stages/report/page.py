"""The report's HTML: one page that needs nothing outside the run folder (inline style, PNGs beside it).

Its small inline script marks each chart image `data-loaded="1"` or `"0"` once the page has loaded,
and the page `data-images-loaded` / `data-images-total`; a chart that failed to load says so in the
page, where a person sees it (and the report test reads those marks).
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from rl360cli.stages.report.charts import Drawn
from rl360cli.stages.report.series import RunSummary, duration, eval_words

STATUS_COLOUR = {"finished": "#1a7f37", "running": "#0969da", "starting": "#0969da", "failed": "#cf222e",
                 "stopped": "#9a6700"}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1340px; color: #1f2328; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.status { display: inline-block; color: #fff; border-radius: 4px; padding: 1px 8px; font-weight: 600; }
.detail { margin: 6px 0 14px; } table.summary td { padding: 2px 14px 2px 0; vertical-align: top; }
table.summary td:first-child { color: #59636e; }
.top { display: grid; grid-template-columns: minmax(420px, 1fr) minmax(420px, 1.3fr); gap: 24px; }
.top h2 { margin-top: 8px; } .source { color: #59636e; font-size: 12.5px; overflow-wrap: anywhere; margin: 0 0 6px; }
pre { background: #f6f8fa; padding: 10px; border-radius: 6px; overflow: auto; font-size: 12px; max-height: 360px;
  white-space: pre-wrap; margin: 0; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(640px, 1fr)); gap: 18px; }
figure { margin: 0; border: 1px solid #d1d9e0; border-radius: 6px; padding: 8px; }
figure img { width: 100%; height: auto; display: block; }
figcaption { color: #59636e; font-size: 12.5px; margin-top: 4px; }
.missing .blank { height: 120px; display: flex; align-items: center; justify-content: center; color: #59636e;
  background: repeating-linear-gradient(45deg, #f6f8fa, #f6f8fa 10px, #fff 10px, #fff 20px); }
.broken { color: #cf222e; font-weight: 600; } footer { margin-top: 28px; color: #59636e; font-size: 12.5px; }
"""

MARK_IMAGES = """
window.addEventListener("load", function () {
  var loaded = 0;
  for (var i = 0; i < document.images.length; i++) {
    var img = document.images[i], ok = img.complete && img.naturalWidth > 0;
    img.dataset.loaded = ok ? "1" : "0";
    if (ok) { loaded++; } else {
      var note = document.createElement("p");
      note.className = "broken";
      note.textContent = "this chart did not load: " + img.getAttribute("src");
      img.after(note);
    }
  }
  document.body.dataset.imagesLoaded = loaded;
  document.body.dataset.imagesTotal = document.images.length;
});
"""


def _number(value: float | None, spec: str = ".3f") -> str:
    return "not recorded" if value is None else format(value, spec)


def render_page(summary: RunSummary, drawn: list[Drawn], *, recipe_text: str | None, recipe_source: str,
                run_dir: str, trajectories: str | None = None) -> str:
    """The run's page; `trajectories` (what trajectories.html shows, in a line) links to that page."""
    e = html.escape
    p = summary.progress
    colour = STATUS_COLOUR.get(summary.status, "#59636e")
    rows = [
        ("progress", f"{p.done} of {p.total if p.total is not None else '?'} steps"
                     + (f", about {duration(p.eta_s)} left" if p.eta_s is not None else "")),
        ("time", f"{duration(p.elapsed_s)} since it started"),
        ("started", summary.started_at or "-"),
        ("ended", summary.ended_at or ("-" if p.active else "not recorded")),
        ("reward", "no step yet" if summary.reward_last is None else
         f"{summary.reward_first:.3f} → {summary.reward_last:.3f} (best {summary.reward_best:.3f})"),
        ("pass rate (last step)", _number(summary.pass_last)),
        ("infra failures", f"{summary.infra_failures} masked" + (
            " (" + ", ".join(f"{c} {n}" for c, n in summary.infra_by_cause.items()) + ")"
            if summary.infra_by_cause else "")),
        ("held-out eval", eval_words(p) or "not recorded"),
        ("overrides (--set)", " ".join(summary.overrides) or "none"),
        ("run folder", run_dir),
    ]
    figures = []
    for item in drawn:
        title = e(item.chart.title)
        if item.file is None:
            figures.append(f'<figure class="missing" data-chart="{e(item.chart.name)}"><div class="blank">'
                           f'{title}: not recorded</div><figcaption>not recorded in metrics.jsonl '
                           f'({e(item.chart.metric_names())})</figcaption></figure>')
        else:
            note = f"; {e(item.note)}" if item.note else ""
            figures.append(f'<figure data-chart="{e(item.chart.name)}"><img src="{e(item.file)}" alt="{title}" '
                           f'width="640" height="320"><figcaption>{e(item.chart.about)}{note}</figcaption></figure>')
    recipe = (f"<pre>{e(recipe_text)}</pre>" if recipe_text is not None
              else "<p>the recipe file is not in the run folder</p>")
    links = ("" if trajectories is None else
             f'<p class="detail"><a href="trajectories.html">Trajectories: what the agent did</a> ({e(trajectories)})</p>')
    written = datetime.now(timezone.utc).isoformat(timespec="seconds")
    snapshot = " The run goes on: this page is a snapshot; run <code>rl360 report</code> again to refresh it." \
        if p.active else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rl360 run {e(summary.run_id)}: {e(summary.status)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>
<body data-status="{e(summary.status)}">
<h1>rl360 run {e(summary.run_id)} <span class="status" style="background:{colour}">{e(summary.status)}</span></h1>
<p class="detail">{e(summary.detail)}</p>{links}
<div class="top"><div><h2>Summary</h2>
<table class="summary">{"".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in rows)}</table></div>
<div><h2>Recipe</h2><p class="source">{e(recipe_source)}</p>{recipe}</div></div>
<h2>Charts</h2><div class="charts">{"".join(figures)}</div>
<footer>Written {e(written)} by <code>rl360 report</code> from metrics.jsonl and the state file.{snapshot}</footer>
<script>{MARK_IMAGES}</script>
</body></html>
"""

"""The pipelines view as one HTML page (pure: overviews in, text out). Every value from the
ledger is escaped; each figure carries a `data-field` attribute, so a test can read the page
as a person sees it and compare it with the ledger.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from html import escape
from urllib.parse import quote

from exactly_once.ledger.planning import describe_ranges
from exactly_once.operate.overview import PipelineOverview
from exactly_once.operate.status import CheckpointSummary
from exactly_once.operate.status_report import duration, render_refusal, render_stall, render_went_back

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #1a202c; background: #fff; }
section { border: 1px solid #cbd5e0; border-radius: 6px; padding: 8px 16px; margin-bottom: 16px; }
section.stalled { border: 2px solid #c53030; }
h2 { margin: 4px 0; } h3 { margin: 12px 0 4px; font-size: 15px; }
.badge { font-size: 12px; padding: 2px 8px; border-radius: 10px; color: #fff; background: #2f855a; }
.stalled .badge { background: #c53030; }
table { border-collapse: collapse; } td, th { padding: 2px 10px 2px 0; text-align: left; vertical-align: top; }
th { color: #4a5568; font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-size: 12px; background: #f7fafc; } pre { white-space: pre-wrap; padding: 6px; }
.none { color: #718096; } svg text { font-size: 10px; fill: #4a5568; }
"""


def page(overviews: list[PipelineOverview], ui_root: str, history: int, refreshed: datetime) -> str:
    body = "".join(_pipeline(o, ui_root) for o in overviews) or '<p class="none">No pipeline has run yet.</p>'
    return (f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="30">'
            f"<title>Exactly-once pipelines</title><style>{STYLE}</style></head><body>"
            f"<p class=\"none\">Read from the ledger at {escape(_when(refreshed))}; charts cover the last "
            f"{history} checkpoints (<code>?history=N</code>). Refreshes every 30 s.</p>{body}</body></html>")


def _pipeline(o: PipelineOverview, ui_root: str) -> str:
    s = o.status
    run = _run_link(ui_root, o.dag_id)
    last = s.last_commit
    parts = [
        f'<h2>{escape(s.name)} <span class="badge" data-field="health">{"STALLED" if s.stopped else "ok"}</span></h2>',
        f'<div class="none">DAG: {escape(o.dag_id or "not known yet")}</div>',
        *(f'<pre data-field="stall">{escape(render_stall(s.name, stall))}</pre>' for stall in s.stalls),
        *(f'<pre data-field="stall">{escape(render_went_back(s.name, p))}</pre>' for p in s.lag if p.went_back),
        *(f'<pre data-field="{"stall" if r.loud else "refusal"}">{escape(render_refusal(s.name, r))}</pre>'
          for r in s.refusals),
        "<h3>Last committed checkpoint</h3>",
        ('<p class="none">none yet</p>' if last is None else
         f'<p>checkpoint <span data-field="last-commit-id">{run(last.id, last.dag_run_id)}</span>: '
         f'<span data-field="last-commit-records">{last.records}</span> records, interval end '
         f"{escape(_when(last.interval_end))}, committed {escape(_when(last.committed_at))}</p>"),
        "<h3>Lag per partition (offsets)</h3>",
        (f'<p class="none" data-field="lag-unknown">{escape(o.lag_unknown)}</p>' if o.lag_unknown else
         _table(["topic", "partition", "committed up to", "last stable", "lag"],
                [[escape(p.topic), p.partition, p.committed_end, p.last_stable, f'<b data-field="lag">{p.lag}</b>']
                 for p in s.lag], "lag-row")),
        "<h3>Open checkpoints (planned, running, stalled, pre-committed)</h3>",
        _checkpoints(s.open, run, "open-checkpoint") if s.open else '<p class="none">none</p>',
        "<h3>Gaps (offsets lost to retention)</h3>",
        _table(["topic", "partition", "offsets", "checkpoint", "recorded"],
               [[escape(g.range.topic), g.range.partition, f"{g.range.start}..{g.range.end}", g.checkpoint_id,
                 escape(_when(g.recorded_at))] for g in s.gaps], "gap") if s.gaps else '<p class="none">none</p>',
        *(["<h3>Kafka sinks: committed, not yet published</h3>", _backlog(s.backlog)] if s.backlog else []),
        "<h3>Dead letters</h3>",
        _dead_letters(o),
        f"<h3>Last {len(s.history)} checkpoints</h3>",
        _chart(s.history, "records", "records read", lambda c: c.records or 0, lambda v: f"{v:,}"),
        _chart(s.history, "latency", "seconds from begin to commit", _latency, lambda v: f"{v:.1f} s"),
        _checkpoints(s.history, run, "history-checkpoint"),
    ]
    health = "stalled" if s.stopped else "ok"
    return f'<section class="{health}" data-pipeline="{escape(s.name)}">{"".join(parts)}</section>'


def _backlog(backlog) -> str:
    return _table(["sink", "records", "from checkpoint", "published through", "published", "held behind"],
                  [[escape(b.sink), b.records, b.first_checkpoint, "" if b.published_through is None else
                    b.published_through, escape(_when(b.published_at)),
                    "" if b.held_behind is None else
                    f"checkpoint {b.held_behind} ({escape(b.held_reason or 'open, planned before')})"]
                   for b in backlog], "backlog")


def _dead_letters(o: PipelineOverview) -> str:
    if not o.dead_letter_reasons:
        return '<p class="none">none</p>'
    counts = _table(["reason", "records"], [[f'<span data-field="dead-letter-reason">{escape(r)}</span>',
                                              f'<span data-field="dead-letter-count">{n}</span>']
                                             for r, n in o.dead_letter_reasons], "dead-letter-reason-row")
    headers = ["topic", "partition", "offset", "reason", "checkpoint", "committed", "bytes", "value (first bytes)"]
    newest = _table(headers,
                    [[escape(d.topic), d.partition, d.offset, f'<span data-field="reason">{escape(d.reason)}</span>',
                      d.checkpoint_id, escape(_when(d.committed_at)), "null" if d.size is None else d.size,
                      NOT_SHOWN if d.preview is None else f'<code data-field="preview">{escape(d.preview)}</code>']
                     for d in o.newest_dead_letters], "dead-letter")
    hidden = any(d.preview is None for d in o.newest_dead_letters)
    return f"{counts}<p>Newest {len(o.newest_dead_letters)}:</p>{newest}{PREVIEWS_RULE if hidden else ''}"


NOT_SHOWN = '<span class="none" data-field="preview-not-shown">not shown</span>'
PREVIEWS_RULE = ('<p class="none" data-field="previews-rule">Record values (the first bytes, a reason\'s exact '
                 "text) are shown only to users who may edit the pipeline's DAG, and only when "
                 "<code>[exactly_once] show_payloads</code> is on; numbers in reasons are shown as #.</p>")


def _checkpoints(checkpoints: tuple[CheckpointSummary, ...], run, row: str) -> str:
    return _table(["checkpoint", "state", "interval", "ranges", "records", "attempts", "config", "to pre-commit",
                   "to commit"],
                  [[run(c.id, c.dag_run_id), f'<span data-field="state">{escape(c.what)}</span>',
                    f"{escape(_when(c.interval_start))} → {escape(_when(c.interval_end))}",
                    escape(describe_ranges(c.ranges)), c.records or 0, c.attempts,
                    f'<code data-field="config">{escape(c.config_version or "")}</code>',
                    duration(c.until_precommit), duration(c.until_commit)] for c in checkpoints], row)


def _latency(c: CheckpointSummary) -> float:
    if c.until_commit is None:
        return 0.0
    return (c.until_commit + (c.until_precommit or timedelta())).total_seconds()


def _chart(history: tuple[CheckpointSummary, ...], field: str, title: str, value, label) -> str:
    """Bars, oldest first; each bar says its checkpoint and value (hover shows them)."""
    shown = list(reversed(history))
    if not shown:
        return ""
    width, height, top = 24, 90, max(value(c) for c in shown) or 1
    bars = []
    for i, c in enumerate(shown):
        v = value(c)
        h = round(v / top * height)
        bars.append(f'<g data-field="{field}-bar" data-checkpoint="{c.id}" data-value="{v}">'
                    f"<title>checkpoint {c.id}: {escape(label(v))}</title>"
                    f'<rect x="{i * width + 2}" y="{height - h + 12}" width="{width - 4}" height="{h}" fill="#3182ce"/>'
                    f'<text x="{i * width + 2}" y="{height + 24}">{c.id}</text></g>')
    return (f'<figure><figcaption>{escape(title)} per checkpoint (max {escape(label(top))})</figcaption>'
            f'<svg width="{len(shown) * width}" height="{height + 28}" role="img" aria-label="{escape(title)}">'
            f'{"".join(bars)}</svg></figure>')


def _run_link(ui_root: str, dag_id: str | None):
    def link(checkpoint_id: int, dag_run_id: str) -> str:
        if dag_id is None:
            return f"{checkpoint_id} <span class=\"none\">(run {escape(dag_run_id)})</span>"
        href = f"{ui_root}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"
        return f'<a href="{escape(href)}" target="_top" title="DAG run {escape(dag_run_id)}">{checkpoint_id}</a>'
    return link


def _table(headers: list[str], rows: list[list], row: str) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(f'<tr data-row="{row}">' + "".join(
        f'<td class="n">{v}</td>' if isinstance(v, int) else f"<td>{v}</td>" for v in cells) + "</tr>"
        for cells in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _when(t: datetime | None) -> str:
    return "" if t is None else t.strftime("%Y-%m-%d %H:%M:%S %Z")

"""What the dashboard shows, worked out in Python so the templates only lay it out.

Times become {iso, exact, relative}, byte counts become "1.2 MB", a batch row becomes
its progress percentages, tokens/s and ETA. No database and no engine here: callers hand
in the rows and figures they already have.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from app.batches import throughput
from app.batches.claims.projection import Projection, seconds_left
from app.batches.lifecycle.lifecycle import usage_counts
from app.batches.service import LineDetail
from app.tables import Batch, BatchStatus, File, Request, RequestStatus, WebhookDelivery
from app.wire.thoughts import answer_thought

STATUS_TONE = {
    BatchStatus.VALIDATING: "info",
    BatchStatus.IN_PROGRESS: "info",
    BatchStatus.FINALIZING: "info",
    BatchStatus.CANCELLING: "warn",
    BatchStatus.COMPLETED: "ok",
    BatchStatus.FAILED: "bad",
    BatchStatus.EXPIRED: "bad",
    BatchStatus.CANCELLED: "muted",
}


def when(ts: int | float | None, now: float | None = None) -> dict[str, str] | None:
    """A unix time as the machine-readable, exact and relative texts of a <time> tag."""
    if ts is None:
        return None
    now = time.time() if now is None else now
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    return {
        "iso": dt.isoformat(),
        "exact": dt.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "relative": relative(ts - now),
    }


def relative(delta: float) -> str:
    """-90 -> '2 min ago', 3600 -> 'in 1 h'. static/app.js has the same rule, on purpose:
    the server renders the first text and the page keeps it fresh."""
    future = delta > 0
    s = abs(delta)
    if s < 45:
        return "just now" if not future else "in a few seconds"
    unit, size = next(
        ((u, n) for u, n in (("d", 86400), ("h", 3600)) if s >= n * 0.75), ("min", 60)
    )
    n = max(1, round(s / size))
    return f"in {n} {unit}" if future else f"{n} {unit} ago"


def size(n: int | None) -> str:
    if n is None:
        return "—"
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KB", "MB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


@dataclass
class Sample:
    t: float
    output_tokens: int
    done: int


@dataclass
class RateTracker:
    """Recent tokens/s and lines/s of one batch, from the samples one live stream saw.

    A batch's counters move when a line finishes, so a short window over a batch of long
    lines often sees nothing; then the average since the batch started running is shown.
    `engine` keeps the engine's own generated tokens/s, sampled each tick, for the bars.
    """

    window: float = 30.0
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=240))
    engine: deque[float] = field(default_factory=lambda: deque(maxlen=40))

    def add(self, batch: Batch, t: float | None = None, engine_tps: float | None = None) -> None:
        t = time.time() if t is None else t
        self.samples.append(Sample(t, batch.output_tokens, batch.completed + batch.failed))
        while len(self.samples) > 2 and t - self.samples[0].t > self.window:
            self.samples.popleft()
        if engine_tps is not None:
            self.engine.append(engine_tps)

    def rates(self, batch: Batch, t: float | None = None) -> tuple[float | None, float | None]:
        """(tokens/s, lines/s), or None where nothing has run yet."""
        t = time.time() if t is None else t
        if len(self.samples) >= 2:
            a, b = self.samples[0], self.samples[-1]
            span = b.t - a.t
            if span >= 5.0 and b.done > a.done:
                return (b.output_tokens - a.output_tokens) / span, (b.done - a.done) / span
        return average_rates(batch, t)


def average_rates(batch: Batch, t: float | None = None) -> tuple[float | None, float | None]:
    if not batch.in_progress_at:
        return None, None
    t = time.time() if t is None else t
    end = batch.finalizing_at or batch.completed_at or batch.cancelled_at or batch.failed_at
    span = (end or t) - batch.in_progress_at
    if span <= 0:
        return None, None
    return batch.output_tokens / span, (batch.completed + batch.failed) / span


def batch_row(
    batch: Batch,
    tracker: RateTracker | None = None,
    now: float | None = None,
    projection: Projection | None = None,
) -> dict[str, Any]:
    """One batch as the list row and the batch page's summary show it; `projection` is the
    runner's (projection.py) while it is in progress."""
    now = time.time() if now is None else now
    total = batch.total
    done = batch.completed + batch.failed
    running = batch.status in BatchStatus.ACTIVE
    in_progress = batch.status == BatchStatus.IN_PROGRESS
    tok_s, _ = tracker.rates(batch, now) if tracker else average_rates(batch, now)
    live = projection if in_progress and projection and projection.finish_at else None
    eta = None
    if live is not None:  # the one estimate, as the chart and `batchyard run` show it
        eta = seconds_left(live.finish_at, now, total=total, done=done)
    return {
        "id": batch.id,
        "created": when(batch.created_at, now),
        "endpoint": batch.endpoint,
        "model": batch.model or "—",
        "status": batch.status,
        "status_text": batch.status.replace("_", " "),
        "tone": STATUS_TONE.get(batch.status, "muted"),
        "running": running,
        "cancellable": batch.status in BatchStatus.CANCELLABLE,
        "total": total,
        "completed": batch.completed,
        "failed": batch.failed,
        "done": done,
        "pct_completed": 100.0 * batch.completed / total if total else 0.0,
        "pct_failed": 100.0 * batch.failed / total if total else 0.0,
        # Counters move as lines finish: before the first one a rate would read as a false 0.
        "tokens_per_s": f"{tok_s:.1f}" if tok_s is not None and running and done else None,
        "eta": throughput.duration(eta) if eta is not None else None,
        # The projected finish (the lane's rate, the lines ahead, the batch's share) and the
        # completion window's end, while it can still run out of it.
        "finish": when(now + eta, now) if eta is not None else None,
        "deadline": when(batch.expires_at, now)
        if batch.status in BatchStatus.CANCELLABLE
        else None,
        "late": live is not None and live.late,
        "ahead": live.ahead if live is not None else None,
        "share": f"{100 * live.share:.0f}%" if live is not None else None,
        "input_tokens": batch.input_tokens,
        "output_tokens": batch.output_tokens,
        "engine_history": list(tracker.engine) if tracker else [],
        "engine_tps": f"{tracker.engine[-1]:.1f}" if tracker and tracker.engine else None,
    }


TIMELINE = (
    ("created_at", "Created"),
    ("in_progress_at", "Started"),
    ("finalizing_at", "Finalizing"),
    ("completed_at", "Completed"),
    ("failed_at", "Failed"),
    ("cancelling_at", "Cancelling"),
    ("cancelled_at", "Cancelled"),
    ("expired_at", "Expired"),
    ("expires_at", "Expires"),
)


def timeline(openai_batch: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """Each timestamp the batch has, in order of time (the expiry shown last while it runs)."""
    steps = []
    running = openai_batch.get("status") in BatchStatus.ACTIVE
    for key, label in TIMELINE:
        ts = openai_batch.get(key)
        if key == "expires_at" and not running:
            continue  # the window only matters while the batch can still run out of it
        if ts:
            steps.append(
                {"label": label, "time": when(ts, now), "ts": ts, "future": key == "expires_at"}
            )
    return sorted(steps, key=lambda s: (s["future"], s["ts"]))


def file_row(f: File, now: float | None = None) -> dict[str, Any]:
    return {
        "id": f.id,
        "filename": f.filename,
        "purpose": f.purpose,
        "size": size(f.bytes),
        "bytes": f.bytes,
        "created": when(f.created_at, now),
        "expires": when(f.expires_at, now),
    }


def result_row(line: dict[str, Any]) -> dict[str, Any]:
    """A result line as the results table shows it: the start of the answer or the error."""
    body = line.get("body") or {}
    error = line.get("error")
    preview = ""
    if error:
        preview = (error.get("message") if isinstance(error, dict) else str(error)) or ""
    elif isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            preview = body["error"].get("message") or ""
        else:
            preview = answer_text(body)
    whole = json.dumps(line, indent=2, ensure_ascii=False)
    return {
        "custom_id": line.get("custom_id", ""),
        "status": line.get("status", ""),
        "status_code": line.get("status_code"),
        "ok": not error and line.get("status") in ("succeeded", None) and not body.get("error"),
        "preview": preview[:160] + ("…" if len(preview) > 160 else ""),
        "whole": whole,
    }


def answer_text(body: dict[str, Any]) -> str:
    choices = body.get("choices") or []
    if choices:
        first = choices[0]
        message = first.get("message") or {}
        calls = [c.get("function") or {} for c in message.get("tool_calls") or []]
        if calls:
            return " ".join(f"{c.get('name')}({c.get('arguments')})" for c in calls)
        return message.get("content") or first.get("text") or ""
    if body.get("object") == "response":  # /v1/responses: a message, or function calls
        parts = []
        for item in body.get("output") or []:
            if item.get("type") == "message":
                parts += [c.get("text") or "" for c in item.get("content") or []]
            elif item.get("type") == "function_call":
                parts.append(f"{item.get('name')}({item.get('arguments')})")
        return " ".join(parts)
    data = body.get("data")
    if isinstance(data, list) and data:
        emb = data[0].get("embedding") or []
        return f"embedding, {len(emb)} dimensions"
    return ""


#: The throughput chart's drawing box (SVG user units); the plot sits inside the margins.
CHART_W, CHART_H = 640, 200
PLOT_X0, PLOT_X1, PLOT_Y0, PLOT_Y1 = 48, 592, 12, 172


def throughput_chart(tp: throughput.Throughput) -> dict[str, Any]:
    """The chart's shapes, drawn by the server: a line of lines done (left axis, 0 to the
    batch's total) over bars of tokens/s (right axis, 0 to the peak), along the batch's life."""
    w, h = PLOT_X1 - PLOT_X0, PLOT_Y1 - PLOT_Y0
    span = tp.span or 1.0
    total = max(tp.total, tp.done, 1)
    peak = tp.peak_tokens_per_s or 0.0

    def x(t: float) -> float:
        return PLOT_X0 + w * t / span

    def y_lines(n: int) -> float:
        return PLOT_Y1 - h * n / total

    points = [(PLOT_X0, PLOT_Y1)] + [(x(b.end), y_lines(b.done)) for b in tp.buckets]
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    bars = []
    for b in tp.buckets:
        if peak and b.tokens:
            bh = h * b.tokens_per_s / peak
            bars.append(
                {
                    "x": f"{x(b.start) + 0.5:.1f}",
                    "y": f"{PLOT_Y1 - bh:.1f}",
                    "w": f"{max(x(b.end) - x(b.start) - 1, 0.5):.1f}",
                    "h": f"{bh:.1f}",
                    "title": f"{b.tokens_per_s:.1f} tokens/s, {b.done} lines done at "
                    f"{throughput.duration(b.end)}",
                }
            )
    return {
        "width": CHART_W,
        "height": CHART_H,
        "x0": PLOT_X0,
        "x1": PLOT_X1,
        "y0": PLOT_Y0,
        "y1": PLOT_Y1,
        "line": line,
        "area": f"{line} {points[-1][0]:.1f},{PLOT_Y1} {PLOT_X0},{PLOT_Y1}",
        "bars": bars,
        "total": total,
        "peak": f"{peak:.0f}" if peak else "—",
        "span": throughput.duration(span),
        "summary": throughput.summary(tp),
        "eta": throughput.duration(tp.eta) if tp.eta is not None else None,
        "done": tp.done,
        "tokens_per_s": f"{tp.tokens_per_s:.1f}" if tp.tokens_per_s is not None else None,
        "peak_tokens_per_s": f"{tp.peak_tokens_per_s:.1f}"
        if tp.peak_tokens_per_s is not None
        else None,
    }


def explorer_row(r: Request) -> dict[str, Any]:
    """A line in the results explorer: its status and the start of its answer or error."""
    body = json.loads(r.body_json) if r.body_json else None
    error = json.loads(r.error_json) if r.error_json else None
    shown = result_row({"custom_id": r.custom_id, "status": r.status, "body": body, "error": error})
    tone = {
        RequestStatus.SUCCEEDED: "ok",
        RequestStatus.FAILED: "bad",
        RequestStatus.EXPIRED: "bad",
        RequestStatus.CANCELLED: "muted",
    }.get(r.status, "info")
    return {
        "line": r.line,
        "custom_id": r.custom_id,
        "status": r.status,
        "status_code": r.status_code,
        "tone": tone,
        "preview": shown["preview"] if r.status in RequestStatus.DONE else "",
    }


def messages_of(source: dict[str, Any] | None) -> list[dict[str, str]]:
    """The input line's messages as (role, text) pairs; a prompt or an input as one pair."""
    body = (source or {}).get("body")
    if not isinstance(body, dict):
        return []
    out = []
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            content = m.get("content")
            if isinstance(content, list):  # content parts: keep their text
                content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            out.append({"role": str(m.get("role", "")), "text": str(content or "")})
    for key in ("prompt", "input"):
        if key in body and not out:
            value = body[key]
            out.append(
                {"role": key, "text": value if isinstance(value, str) else json.dumps(value)}
            )
    return out


def line_detail(detail: LineDetail) -> dict[str, Any]:
    """One line opened: its input messages beside the answer or the error."""
    r = detail.request
    row = explorer_row(r)
    body = json.loads(r.body_json) if r.body_json else None
    error = json.loads(r.error_json) if r.error_json else None
    if error is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
    answered = isinstance(body, dict) and not error
    usage = body.get("usage") if isinstance(body, dict) else None
    params = {
        k: v
        for k, v in ((detail.input or {}).get("body") or {}).items()
        if k not in ("messages", "prompt", "input")
    }
    return {
        **row,
        "messages": messages_of(detail.input),
        "params": json.dumps(params, ensure_ascii=False) if params else "",
        "input_missing": detail.input is None,
        "answer": answer_text(body) if isinstance(body, dict) and not error else None,
        "error": error,
        "finish_reason": ((body or {}).get("choices") or [{}])[0].get("finish_reason")
        if answered
        else None,
        "usage": usage,
        # A thinking model's thought, shown folded above the answer (never in it).
        "thought": answer_thought(body) if answered else "",
        "reasoning_tokens": usage_counts(usage)[3] if isinstance(usage, dict) else 0,
        "raw": json.dumps(body or error, indent=2, ensure_ascii=False) if (body or error) else "",
        "finished": when(r.finished_at),
    }


DELIVERY_TONES = {"pending": "warn", "delivered": "ok", "failed": "bad"}


def delivery_row(d: WebhookDelivery, now: float | None = None) -> dict[str, Any]:
    return {
        "id": d.id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "url": d.url,
        "status": d.status,
        "tone": DELIVERY_TONES.get(d.status, "muted"),
        "attempts": d.attempts,
        "last_status_code": d.last_status_code,
        "last_error": d.last_error,
        "next_try": when(d.next_attempt_at, now) if d.status == "pending" else None,
    }

"""Draw one webhook's trace as a trace viewer (Jaeger, Tempo) shows it: a waterfall of spans in tree order.

`python scripts/render_trace.py [tests/artifacts/last-trace.json] [docs/tracing.png]`. The JSON is what
tests/test_tracing.py captured from real gunicorn and Celery processes through its OTLP receiver; this
machine cannot run Jaeger or Grafana, so matplotlib draws the same picture from the same spans.
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COLOURS = {"herald-web": "#4c78a8", "herald-worker": "#f58518"}


def _label(span: dict) -> str:
    a = span["attributes"]
    if span["kind"] == "SERVER":
        return f"{span['name']}  → {a.get('http.response.status_code', '')}"
    if span["kind"] == "CLIENT" and span["name"] == "POST":
        outcome = a.get("http.response.status_code") or a.get("error.type", "")
        return f"POST {a.get('url.full', '')}  attempt {a.get('herald.attempt')} → {outcome}"
    if span["name"] == "herald.delivery":
        delivery = a.get("herald.delivery_id", "")[-9:]
        return f"herald.delivery  {delivery} #{a.get('herald.attempt')} → {a.get('herald.status')}"
    if a.get("db.system") == "postgresql":
        return f"postgresql {span['name']}"
    if a.get("db.system") == "redis":
        return f"redis {span['name']}"
    return span["name"]


def _ordered(spans: list[dict]) -> list[tuple[dict, int]]:
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict]] = {}
    for span in spans:
        children.setdefault(span["parent_span_id"] if span["parent_span_id"] in ids else "", []).append(span)
    out: list[tuple[dict, int]] = []

    def walk(parent: str, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s["start_ns"]):
            out.append((span, depth))
            walk(span["span_id"], depth + 1)

    walk("", 0)
    return out


def render(source: Path, target: Path) -> None:
    spans = json.loads(source.read_text())["trace"]
    rows = _ordered(spans)
    start = min(s["start_ns"] for s in spans)
    end = max(s["end_ns"] for s in spans)
    total_ms = (end - start) / 1e6
    fig, ax = plt.subplots(figsize=(15, 0.32 * len(rows) + 1.6))
    for y, (span, depth) in enumerate(rows):
        left = (span["start_ns"] - start) / 1e6
        width = max((span["end_ns"] - span["start_ns"]) / 1e6, total_ms / 600)
        colour = COLOURS.get(span["service"], "#888888")
        failed = span["status_code"] == 2
        ax.barh(y, width, left=left, height=0.62, color=colour, edgecolor="#c0392b" if failed else colour,
                linewidth=1.5 if failed else 0.5)
        duration = (span["end_ns"] - span["start_ns"]) / 1e6
        ax.text(left + width + total_ms / 300, y, f"{'  ' * depth}{_label(span)}   {duration:.1f} ms",
                va="center", fontsize=7.5, color="#c0392b" if span["status_code"] == 2 else "#222222")
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlim(0, total_ms * 1.65)
    ax.set_xlabel("milliseconds since the intake request began")
    trace_id = spans[0]["trace_id"]
    caller = next((s["parent_span_id"] for s, depth in rows if depth == 0), "")
    ax.set_title(f"One webhook's trace {trace_id}: POST /api/v1/events (parent: the caller's span {caller}) to every "
                 f"attempt of its two deliveries", fontsize=10, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="#c0392b", linewidth=1.5))
    ax.legend(handles, [*COLOURS, "status ERROR"], loc="lower right", fontsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    render(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "artifacts" / "last-trace.json",
           Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "tracing.png")

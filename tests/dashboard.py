"""The Grafana dashboard (deploy/grafana/herald-dashboard.json) read without Grafana: its panels' queries run
against a real Prometheus, and drawn with matplotlib (Grafana is not in Debian's packages)."""
import json
import math
import re
from datetime import datetime
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "herald-dashboard.json"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#96d98d"]


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    return [panel for panel in dashboard["panels"] if panel.get("targets")]


def expand(expr: str, *, job: str, rate_interval: str) -> str:
    """A panel's query as Grafana sends it: the dashboard's `$job` variable and the `$__rate_interval` macro filled in."""
    return expr.replace("$__rate_interval", rate_interval).replace("$job", job)


def query(prometheus: str, expr: str, **params) -> dict:
    """/api/v1/query (or query_range, with start/end/step): the `data` of a successful answer."""
    path = "query_range" if "step" in params else "query"
    body = requests.get(f"{prometheus}/api/v1/{path}", params={"query": expr, **params}, timeout=10).json()
    if body["status"] != "success":
        raise AssertionError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def _legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def _format(value: float, unit: str) -> str:
    if math.isnan(value):
        return "no data"
    if unit == "s":
        return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"
    if unit == "percentunit":
        return f"{value:.0%}"
    return f"{value:,.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.2f}"


def render(prometheus: str, *, start: float, end: float, path: Path, job: str, scrape_seconds: float,
           note: str = "") -> None:
    """Draw every panel at its grid position, over [start, end], from Prometheus at `prometheus`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    dashboard = load()
    shown = panels(dashboard)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in shown)
    step = max(scrape_seconds, (end - start) / 240)
    rate_interval = f"{max(4 * scrape_seconds, step):.0f}s"
    unit_height = 0.42  # inches per grid row
    fig = plt.figure(figsize=(18, rows * unit_height + 0.8), facecolor="#111217")
    top = 0.6 / (rows * unit_height + 0.8)
    fig.text(0.01, 1 - top / 2, f"{dashboard['title']}  ·  {datetime.fromtimestamp(start):%H:%M:%S} to "
                                f"{datetime.fromtimestamp(end):%H:%M:%S}  ·  {note}",
             color="#d8d9da", fontsize=11, va="center")
    for panel in shown:
        grid, unit = panel["gridPos"], panel["fieldConfig"]["defaults"].get("unit", "short")
        left, width = grid["x"] / 24, grid["w"] / 24
        bottom = 1 - top - (grid["y"] + grid["h"]) / rows * (1 - top)
        height = grid["h"] / rows * (1 - top)
        ax = fig.add_axes([left + 0.03, bottom + 0.015, width - 0.06, height - 0.035], facecolor="#181b1f")
        ax.set_title(panel["title"], color="#d8d9da", fontsize=10, loc="left")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        if panel["type"] == "stat":
            expr = expand(panel["targets"][0]["expr"], job=job, rate_interval=rate_interval)
            result = query(prometheus, expr, time=end)["result"]
            value = float(result[0]["value"][1]) if result else float("nan")
            color = "#73bf69"
            for threshold in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]:
                if threshold["value"] is None or (not math.isnan(value) and value >= threshold["value"]):
                    color = {"green": "#73bf69", "orange": "#ff9830", "red": "#f2495c"}[threshold["color"]]
            ax.set_facecolor(color)
            ax.text(0.5, 0.42, _format(value, unit), color="white", fontsize=22, ha="center", va="center",
                    weight="bold", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        right, colors = None, iter(PALETTE * 4)  # one color cycle across both axes
        for target in panel["targets"]:
            expr = expand(target["expr"], job=job, rate_interval=rate_interval)
            on_right = any(o["matcher"]["options"] == target["legendFormat"] and
                           any(p["id"] == "custom.axisPlacement" for p in o["properties"])
                           for o in panel["fieldConfig"]["overrides"])
            if on_right and right is None:
                right = ax.twinx()
                right.tick_params(colors="#8e8e8e", labelsize=7)
            for series in query(prometheus, expr, start=start, end=end, step=step)["result"]:
                times = [datetime.fromtimestamp(float(t)) for t, _ in series["values"]]
                values = [float(v) for _, v in series["values"]]
                (right if on_right else ax).plot(times, values, linewidth=1.3, color=next(colors),
                                                 label=_legend(target["legendFormat"], series["metric"]),
                                                 linestyle="--" if "alert" in target["legendFormat"] else "-")
        handles = [h for a in (ax, right) if a is not None for h in a.get_legend_handles_labels()[0]]
        labels = [label for a in (ax, right) if a is not None for label in a.get_legend_handles_labels()[1]]
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="upper left", facecolor="#181b1f", labelcolor="#d8d9da",
                      edgecolor="#2c3235", ncol=min(4, len(handles)))
        else:
            ax.text(0.5, 0.5, "no data", color="#8e8e8e", ha="center", va="center", transform=ax.transAxes)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        if unit == "percentunit":
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.grid(color="#2c3235", linewidth=0.5)
    fig.savefig(path, dpi=80, facecolor=fig.get_facecolor())
    plt.close(fig)

"""The benchmark report renders the targets against what was measured, and flags what is missed."""
import json
from pathlib import Path

from bench.report import headline, write_report

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "results.json"


def test_headline_flags_missed_targets(tmp_path):
    results = json.loads(RESULTS.read_text())
    rows = {name: (value, ok) for name, _, value, ok in headline(results)}
    replay = results["intake"]
    herald = next(r for r in replay if r["mode"] == "replay" and r["target"] == "herald" and r["connections"] == 16)
    floor = next(r for r in replay if r["mode"] == "replay" and r["target"] == "floor" and r["connections"] == 16)
    assert rows["intake replay vs floor"][1] == (herald["rps"] / floor["rps"] >= 1.0)
    assert rows["prune rows/s"][1] == (results["prune"]["rows_per_second"] >= 100_000)

    sustained = results["sustained"]
    ratio_row = "sustained load: that highest rate, Herald against the plain DRF + Celery on-commit sender"
    assert rows[ratio_row][1] == (sustained["highest_rate"] >= 2 * sustained["plain_highest_rate"] > 0)
    # neither side holding any rate is no ratio met
    nothing = {**results, "sustained": {**sustained, "highest_rate": 0, "plain_highest_rate": 0}}
    assert dict((n, ok) for n, _, _, ok in headline(nothing))[ratio_row] is False

    # the same results with a slow prune fail that target
    results["prune"]["rows_per_second"] = 50_000
    assert dict((n, ok) for n, _, _, ok in headline(results))["prune rows/s"] is False

    write_report(results, tmp_path)
    assert "| prune rows/s | >= 100,000 | 50,000 | **no** |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 10_000

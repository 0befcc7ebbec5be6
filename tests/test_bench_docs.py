"""README.md and docs/benchmarks.md quote the bench's figures from bench/results/results.json, each part stamped
with what it ran on; the labels say what ran and the caveats which comparisons were unequal."""
import copy
import json
import shutil
from pathlib import Path

from bench.report import BLOCKS, caveats, markdown, readme_figures, render_docs, stamp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = json.loads((ROOT / "bench" / "results" / "results.json").read_text())
NOT_SECTIONS = {"machine", "quick", "smoke", "started", "stamps"}


def test_readme_and_docs_figures_are_those_of_results_json():
    stale = render_docs(RESULTS, ROOT, write=False)
    assert stale == [], f"{stale}: run `.venv/bin/python -m bench.report --docs`"


def test_a_figure_that_differs_from_results_json_is_caught(tmp_path):
    for name in BLOCKS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    changed = copy.deepcopy(RESULTS)
    herald = next(r for r in changed["intake"] if (r["mode"], r["target"], r["connections"]) == ("first", "herald", 16))
    herald["rps"] *= 2
    assert render_docs(changed, tmp_path, write=False) == ["README.md:figures", "docs/benchmarks.md:results"]
    # a hand edit inside a block is caught too, and --docs puts the generated text back
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("first executions/s", "first executions a second"))
    assert render_docs(RESULTS, tmp_path, write=True) == ["README.md:figures"]
    assert render_docs(RESULTS, tmp_path, write=False) == []
    assert readme.read_text() == (ROOT / "README.md").read_text()


def test_every_section_says_what_it_ran_on_and_when():
    sections = [k for k in RESULTS if k not in NOT_SECTIONS]
    assert sections
    for section in sections:
        s = RESULTS["stamps"][section]
        assert s["started"], section
        assert s.get("commit") or s.get("recorded_in"), section
        assert stamp(RESULTS, section) != "not stamped"


def test_a_stamped_part_names_its_commit_and_an_uncommitted_tree():
    results = copy.deepcopy(RESULTS)
    results["stamps"]["prune"] = {"commit": "0123456789ab", "dirty": True, "dirty_files": ["bench/x.py"],
                                  "started": "2026-12-02T10:00:00Z", "quick": False, "smoke": False, "rounds": 5}
    assert stamp(results, "prune") == "commit 0123456 with uncommitted changes, 2026-12-02 10:00 UTC"
    assert "| prune | commit 0123456 with uncommitted changes" in markdown(results)


def test_the_delivery_label_is_the_cap_that_ran_and_an_unbatched_floor_is_marked():
    results = copy.deepcopy(RESULTS)
    row = results["delivery"][-1]
    row.pop("floor_batched", None)
    row["herald_cap"] = 1000
    assert "Herald, endpoint cap 1,000 |" in markdown(results)
    assert "cap 100 |" not in markdown(results)
    assert any("unequal floor" in c for c in caveats(results, "delivery"))
    assert "unequal floor" in readme_figures(results)

    row.update(floor_batched=row["floor"], ratio_batched=1.5, order="abba",
               runs={**row["runs"], "floor_batched": [1]})
    assert caveats(results, "delivery") == []
    assert "1.50x the same task given 100 POSTs a message" in readme_figures(results)


def test_a_key_floor_on_the_full_chain_is_marked():
    results = copy.deepcopy(RESULTS)
    for row in results["intake"]:
        row.pop("chain", None)
        row.pop("order", None)
    assert any("unequal floor" in c for c in caveats(results, "intake"))
    for row in results["intake"]:
        row.update(chain={"bare": "none"}.get(row["target"], "api"), order="abba")
    assert caveats(results, "intake") == []


def test_the_smoke_runs_every_part_once_and_the_sides_alternate():
    from bench.__main__ import PARTS, SMOKE_SECONDS, abba, smoke_plan

    for shards in (1, 4, 40):
        plan = smoke_plan(shards)
        ran = [part for parts in plan for part in parts]
        assert sorted(ran + ["end_to_end"]) == sorted(PARTS), shards  # end_to_end runs with delivery
        assert len(plan) == min(shards, len(ran))
    assert set(SMOKE_SECONDS) == set(PARTS) - {"end_to_end"}  # a new part gets its smoke time
    assert [abba(n, "AB") for n in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]

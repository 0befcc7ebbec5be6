"""Two commits head to head: `python -m bench.compare BASE NEW [--parts intake,dispatch] [--rounds 3]`.

Each commit is checked out into a worktree of its own (under /tmp, sharing this checkout's .venv), and
`python -m bench --only PARTS --rounds 1` runs in each alternately, in ABBA order (A B B A A B for three
rounds), every run into a directory of its own; then the medians of each side and their ratio are printed and
written to `--out` (JSON). Within a run, intake is also measured against the bare floor, which shares the
machine's drift: the ratio to it is the steadier figure.

For a change that the bench's own floors cannot isolate (a schema change: the partitioned history tables,
migration 0028, against the plain ones before it), with the figures that matter for it: intake's first
executions (requests/s, p99, CPU of the web process and of PostgreSQL per request, and the ratio to the bare
floor), and the dispatcher's run (database time, publish rate) and the retries it sent (deliveries/s).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def figures(results: dict) -> dict:
    """The figures compared, from one run's results.json."""
    out = {}
    if "intake" in results:
        def row(target, mode):
            return next(x for x in results["intake"] if x["target"] == target and x["mode"] == mode
                        and x["connections"] == 16)
        herald, bare = row("herald", "first"), row("bare", "first")
        out.update(intake_rps=herald["rps"], intake_p99_ms=herald["p99_ms"], intake_vs_bare=herald["rps"] / bare["rps"],
                   intake_cpu_ms_web=herald["cpu_ms_web"], intake_cpu_ms_postgres=herald["cpu_ms_postgres"])
    if "dispatch" in results:
        d = results["dispatch"]
        out.update(dispatch_db_ms=d["db_ms"], dispatch_publish_per_second=d["publish_per_second"],
                   retries_sent_per_second=d["retries_per_second"])
    return out


def summarize(runs: dict[str, list[Path]], commits: dict[str, str]) -> dict:
    sides = {side: [figures(json.loads((run / "results.json").read_text())) for run in dirs]
             for side, dirs in runs.items()}
    medians = {side: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for side, rows in sides.items()}
    return {"commits": commits, "runs": {side: [str(d) for d in dirs] for side, dirs in runs.items()},
            "each": sides, "medians": medians,
            "new_over_base": {key: medians["new"][key] / medians["base"][key] for key in medians["base"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--parts", default="intake,dispatch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compare.json")
    args = parser.parse_args()
    trees, commits = {}, {}
    for side, ref in (("base", args.base), ("new", args.new)):
        commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        tree = Path(f"/tmp/herald-compare-{side}-{commit[:12]}")
        if not tree.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True)
            (tree / ".venv").symlink_to(ROOT / ".venv")
        trees[side], commits[side] = tree, commit
    runs: dict[str, list[Path]] = {"base": [], "new": []}
    order = [("base", "new")[(n // 2 + n) % 2] for n in range(2 * args.rounds)]  # A B B A A B ...
    for n, side in enumerate(order, 1):
        out = Path(f"/tmp/herald-compare-runs/{n}-{side}")
        subprocess.run([sys.executable, "-m", "bench", "--only", args.parts, "--rounds", "1", "--out", str(out)],
                       cwd=trees[side], check=True)
        runs[side].append(out)
        print(f"compare: run {n} ({side}, {commits[side][:12]}) done", flush=True)
    summary = summarize(runs, commits)
    args.out.write_text(json.dumps(summary, indent=2))
    for key, ratio in summary["new_over_base"].items():
        print(f"{key}: base {summary['medians']['base'][key]:.4g}, new {summary['medians']['new'][key]:.4g}, "
              f"new/base {ratio:.3f}")


if __name__ == "__main__":
    main()

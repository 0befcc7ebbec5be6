"""`python -m bench.reader [--against COMMIT] [--rounds N]`: the buffered worker's HTTP reader against an earlier one.

Three gunicorns as the README starts them (gunicorn.conf.py: 2 workers x 4 threads): Herald with this tree's
worker, Herald with `config/gunicorn_worker.py` as it was at COMMIT (the hand-written reader before issue 21,
by default), and the bare floor. wrk's intake `first` load (c=16) on each in turn, `--rounds` alternating rounds;
medians. Prints requests/s and p99 of each, and the ratios. Writes nothing to bench/results.
"""
import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench import stack
from bench.__main__ import Bench, wrk

ROOT = Path(__file__).resolve().parent.parent
HAND_WRITTEN = "1e8bf2a"   # main before the llhttp reader: config/gunicorn_worker.py's own chunk/header parser


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", default=HAND_WRITTEN, help="commit whose config/gunicorn_worker.py to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()

    old_dir = Path(tempfile.mkdtemp(prefix="herald-old-reader-"))
    source = subprocess.run(["git", "show", f"{args.against}:config/gunicorn_worker.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    (old_dir / "herald_old_reader.py").write_text(source)

    bench = Bench(quick=True)
    try:
        bench.setup()
        old = bench.start(stack.gunicorn(stack.free_port(), name="gunicorn-old-reader",
                                         BENCH_FLOOR_CREDENTIAL_ID=bench.floor_credential.id,
                                         PYTHONPATH=str(old_dir),
                                         GUNICORN_CMD_ARGS="--worker-class herald_old_reader.BufferedThreadWorker"))
        targets = {"llhttp": bench.web.url, "hand-written": old.url, "bare": bench.bare.url}
        runs: dict[str, list[dict]] = {name: [] for name in targets}
        for round_ in range(args.rounds):
            order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
            for name in order:
                path = "/floor/events" if name == "bare" else "/api/v1/events"
                result = wrk(targets[name] + path, mode="first", token=bench.token, path=path,
                             connections=args.connections, seconds=args.seconds)
                assert result["errors"] == 0 and result["non2xx"] == 0, (name, result)
                runs[name].append(result)
                bench.purge_queue()
                print(f"round {round_ + 1} {name:12} {result['rps']:7.0f} req/s p99 {result['p99_ms']:6.1f} ms", flush=True)
            bench.cancel_backlog()
        medians = {name: statistics.median(r["rps"] for r in results) for name, results in runs.items()}
        p99 = {name: statistics.median(r["p99_ms"] for r in results) for name, results in runs.items()}
        for name in targets:
            print(f"{name:12} median {medians[name]:7.0f} req/s  p99 {p99[name]:6.1f} ms  vs bare "
                  f"{medians[name] / medians['bare']:.2f}x  rounds {[round(r['rps']) for r in runs[name]]}")
        print(f"llhttp / hand-written: {medians['llhttp'] / medians['hand-written']:.3f}x requests/s")
    finally:
        for proc in reversed(bench.procs):
            proc.stop()


if __name__ == "__main__":
    main()

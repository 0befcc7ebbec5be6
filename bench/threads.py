"""Where one thread's wall-clock time goes, from a py-spy profile taken with `--idle --threads` (raw format).

py-spy's raw output is one line per distinct stack: `thread (tid): name;frame;frame;... count` (with
`--subprocesses`, `process pid:"cmdline";` before it). With `--idle` a thread is sampled whether it runs
or waits, so the shares of a thread's samples are shares of its wall-clock time. `phases` names the
phase of a stack by the innermost of its frames whose function is one of the given names (py-spy's
qualified name, `Engine._record`, or a module function's plain one); a stack with none of them is
`other`. Within each phase, the samples whose stack reaches psycopg (waiting on PostgreSQL, on a pooled
connection, or building and reading its messages) are counted apart.
"""
from __future__ import annotations

from pathlib import Path


def thread_phases(path: Path, thread: str, phases: dict[str, tuple[str, ...]]) -> dict:
    """{"samples": n, "phases": {phase: {"share": s, "in_psycopg": s}}} for the threads named `thread`."""
    totals: dict[str, int] = {}
    in_psycopg: dict[str, int] = {}
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        # the thread's frame: "thread (tid): name" (after a "process …" frame with --subprocesses)
        head = next((i for i, frame in enumerate(frames) if frame.startswith("thread (")), None)
        if head is None or frames[head].partition(": ")[2] != thread:
            continue
        n = int(count)
        samples += n
        functions = [frame.split(" (", 1)[0] for frame in frames[head + 1:]]
        phase = next((name for function in reversed(functions) for name, names in phases.items()
                      if function in names), "other")
        totals[phase] = totals.get(phase, 0) + n
        if any("psycopg" in frame for frame in frames[head + 1:]):
            in_psycopg[phase] = in_psycopg.get(phase, 0) + n
    return {"samples": samples,
            "phases": {phase: {"share": round(count / samples, 3), "in_psycopg": round(in_psycopg.get(phase, 0) / samples, 3)}
                       for phase, count in sorted(totals.items(), key=lambda kv: -kv[1])} if samples else {}}

"""`python -m blackbox [--profile short|full] [--only SCENARIO,...]`: run the scenarios, print the table."""
from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import traceback

from blackbox.scenarios import ALIASES, PROFILES, RUNNERS, SCENARIOS, Context, Result
from blackbox.stack import DATA, LOGS, RabbitMQ, Stack, install_signal_handlers

COLUMNS = [("scenario", 14), ("load", 46), ("faults injected", 46), ("inputs tried", 12), ("executed twice", 14),
           ("lost", 5), ("result", 6)]


def select(only: str | None) -> list[str]:
    """Scenario names in run order; `only` is a comma-separated list of names or aliases."""
    if not only:
        return list(SCENARIOS)
    wanted: list[str] = []
    for name in (part.strip() for part in only.split(",") if part.strip()):
        names = ALIASES.get(name, [name])
        for item in names:
            if item not in SCENARIOS:
                raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)} "
                                 f"(aliases: {', '.join(ALIASES)})")
            wanted.append(item)
    return [name for name in SCENARIOS if name in wanted]


def _cell(value, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(rows: list[Result], broker: str = "redis") -> str:
    """A plain-text table: the broker, one line per scenario, then what failed and what was noticed."""
    header = " | ".join(name.ljust(width) for name, width in COLUMNS)
    lines = [f"broker: {broker}", header, "-+-".join("-" * width for _, width in COLUMNS)]
    for row in rows:
        cells = [row.scenario, row.load, row.faults, row.inputs, row.executed_twice, row.lost, row.verdict]
        lines.append(" | ".join(_cell(value, width).ljust(width) for value, (_, width) in zip(cells, COLUMNS)))
    details = []
    for row in rows:
        if row.problems or row.notes:
            details.append(f"\n{row.scenario} ({row.verdict}, {row.seconds:.0f}s):")
            details += [f"  ✗ {problem}" for problem in row.problems]
            details += [f"  · {note}" for note in row.notes]
    return "\n".join(lines + details)


def exit_code(rows: list[Result], wanted: list[str], interrupted: bool) -> int:
    """0 only if every wanted scenario ran and passed: nothing lost, nothing executed twice, no assertion failed."""
    if interrupted or [r.scenario for r in rows] != wanted:
        return 1
    return 0 if all(row.passed for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/blackbox", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="short")
    parser.add_argument("--only", help=f"comma-separated: {', '.join(SCENARIOS)} (or {', '.join(ALIASES)})")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the receivers' and clients' RNGs and hypothesis (default: a new one each run, "
                             "printed and kept in the report, so that a failure can be replayed with --seed)")
    parser.add_argument("--broker", choices=["redis", "rabbitmq"], default="redis",
                        help="Celery's broker: a private redis-server (default), or a virtual host of the machine's "
                             "RabbitMQ (127.0.0.1:5672, guest), restarted and purged by the broker scenarios")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)
    wanted = select(args.only)
    profile = PROFILES[args.profile]
    install_signal_handlers()
    started = time.monotonic()
    rows: list[Result] = []
    interrupted = False
    stack = Stack(rabbitmq=RabbitMQ() if args.broker == "rabbitmq" else None)
    broker = args.broker
    ctx: Context | None = None
    try:
        print(f"blackbox: profile {profile.name}, scenarios {', '.join(wanted)}, seed {args.seed} (replay with "
              f"--seed {args.seed}); logs in {LOGS}", flush=True)
        stack.start()
        if stack.rabbitmq:
            broker = f"rabbitmq {stack.rabbitmq.version()} (virtual host {stack.rabbitmq.vhost}, durable queues)"
        print(f"blackbox: stack up in {time.monotonic() - started:.0f}s ({stack.base_url}, postgres "
              f":{stack.pg.port}, redis :{stack.redis.port}, broker {broker})", flush=True)
        ctx = Context(stack, profile, seed=args.seed)
        for index, name in enumerate(wanted):
            began = time.monotonic()
            stack.log(f"scenario {name} starts")
            try:
                result = RUNNERS[name](ctx)
            except Exception as exc:  # noqa: BLE001 - a harness failure is a failed row, not a lost run
                result = Result(name, crashed=True)
                result.problem(f"harness error: {type(exc).__name__}: {exc}")
                stack.log(f"scenario {name} crashed:\n{traceback.format_exc()}")
            result.seconds = time.monotonic() - began
            rows.append(result)
            print(f"blackbox: {name} {result.verdict} in {result.seconds:.0f}s "
                  f"({result.inputs} inputs, twice {result.executed_twice}, lost {result.lost})", flush=True)
            if index < len(wanted) - 1:
                try:
                    result.notes.extend(ctx.heal())
                except Exception as exc:  # noqa: BLE001
                    result.notes.append(f"healing the stack failed: {exc!r}")
    except KeyboardInterrupt:
        interrupted = True
        print("\nblackbox: interrupted; stopping everything", flush=True)
    except Exception as exc:  # noqa: BLE001 - the stack did not come up
        interrupted = True
        print(f"blackbox: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        if ctx is not None:
            ctx.close()
        stack.stop()
    total = time.monotonic() - started
    code = exit_code(rows, wanted, interrupted)
    report = {"profile": profile.name, "broker": broker, "seed": args.seed, "seconds": round(total, 1), "exit_code": code,
              "interrupted": interrupted, "scenarios": [row.as_dict() for row in rows], "stack_events": stack.events}
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    print()
    print(render_table(rows, broker))
    print(f"\nblackbox: {len(rows)}/{len(wanted)} scenarios ran in {total:.0f}s; "
          f"{'all passed' if code == 0 else 'FAILED'}; report {DATA / 'report.json'}")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""bench/threads.py reads where a named thread's time went from a real py-spy profile (--idle --threads)."""
import subprocess
import sys
import textwrap
from pathlib import Path

from bench.threads import thread_phases

PY_SPY = Path(sys.executable).parent / "py-spy"  # a dev dependency (pyproject.toml)

# a thread named as the engine's: about a third of its time in `busy` (on the CPU), the rest in `sleeping`
PROGRAM = textwrap.dedent("""
    import threading, time

    def busy(until):
        while time.monotonic() < until:
            pass

    def sleeping(seconds):
        time.sleep(seconds)

    def loop():
        while True:
            busy(time.monotonic() + 0.01)
            sleeping(0.02)

    threading.Thread(target=loop, name="herald-engine", daemon=True).start()
    print("ready", flush=True)
    time.sleep(30)
""")


def test_the_named_threads_time_is_split_by_its_innermost_named_function(tmp_path):
    program = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    try:
        assert program.stdout.readline().strip() == "ready"
        out = tmp_path / "profile.txt"
        subprocess.run([str(PY_SPY), "record", "--pid", str(program.pid),
                        "--idle", "--threads", "--rate", "200", "--duration", "2", "--format", "raw",
                        "--nonblocking", "--output", str(out)], check=True, capture_output=True)
    finally:
        program.kill()
        program.wait()
    found = thread_phases(out, "herald-engine", {"busy": ("busy",), "asleep": ("sleeping",), "loop": ("loop",)})
    assert found["samples"] > 200
    phases = found["phases"]
    # the innermost named frame decides: `loop` encloses both and is named only where neither runs
    assert set(phases) <= {"busy", "asleep", "loop"}
    assert 0.15 < phases["busy"]["share"] < 0.55
    assert 0.45 < phases["asleep"]["share"] < 0.85
    assert phases["busy"]["in_psycopg"] == 0
    # the main thread (MainThread, asleep for 30 s) is not counted
    assert thread_phases(out, "MainThread", {"busy": ("busy",)})["phases"] == {"other": {"share": 1.0, "in_psycopg": 0.0}}

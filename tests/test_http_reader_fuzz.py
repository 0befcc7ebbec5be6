"""atheris (libFuzzer, coverage-guided) against the buffered worker's reader and gunicorn's parser for a bounded time
(HERALD_FUZZ_SECONDS, default 20), seeded with the review's inputs: zero crashes, zero disagreements
(tests/fuzz_http_reader.py, tests/http_oracle.py). What it found is kept in tests/artifacts/ for a look."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_dir
from tests.test_http_reader import REVIEW

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SECONDS = int(os.environ.get("HERALD_FUZZ_SECONDS", "20"))
SEEDS = [
    *REVIEW.values(),
    b"POST /api/v1/events HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nabcde",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2;a=b\r\nab\r\n0\r\nT: v\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\nGET / HTTP/1.1\r\n\r\n",
]


def test_the_fuzzer_finds_no_crash_and_no_disagreement():
    work = run_dir("fuzz-http-reader")
    corpus = work / "corpus"
    corpus.mkdir()
    for n, seed in enumerate(SEEDS):
        (corpus / f"seed-{n}").write_bytes(bytes([n * 37 % 256]) + seed)   # first byte: where recv() cuts it
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz_http_reader.py"), str(corpus),
                          f"-max_total_time={SECONDS}", "-print_final_stats=1", "-timeout=5", "-rss_limit_mb=1024",
                          f"-artifact_prefix={work}/"], cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 60)
    output = run.stdout + run.stderr
    (work / "output.txt").write_text(output)
    assert run.returncode == 0, output[-4000:]
    runs = int(re.search(r"stat::number_of_executed_units: (\d+)", output).group(1))
    print(f"atheris: {runs} inputs in {SECONDS} s ({runs / SECONDS:.0f}/s), "
          f"corpus {len(list(corpus.iterdir()))} inputs")
    assert runs > 20 * SECONDS   # it really ran (an instrumented, differential run does a few hundred a second)

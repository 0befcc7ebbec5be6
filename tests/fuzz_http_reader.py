"""Coverage-guided fuzzing (atheris, libFuzzer) of the buffered worker's HTTP reader: every input is fed in pieces
cut where the fuzzer says, and checked against gunicorn's parser (tests/http_oracle.py). A crash, an exception
other than a refusal, or a disagreement stops the run with the input that caused it.

    python tests/fuzz_http_reader.py CORPUS_DIR -max_total_time=20 -print_final_stats=1

tests/test_http_reader_fuzz.py runs it for a bounded time in CI, seeded with the review's inputs.
"""
import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports(include=["config.http_reader", "gunicorn.http", "tests.http_oracle"]):
    from tests.http_oracle import check


def one_input(data: bytes) -> None:
    # the first byte says where to cut the rest into two or three recv()-sized pieces
    if not data:
        return
    cut, data = data[0], data[1:]
    splits = [cut % (len(data) + 1), (cut * 7) % (len(data) + 1)] if cut else []
    check(data, splits)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

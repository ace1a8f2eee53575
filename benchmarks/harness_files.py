"""Cost of reading and writing a harness folder safely (`harness/files.py`): `load_harness` on a built-in seed
and `HarnessVersion.write` (what freezing, the implementer's copy and every sandbox worker do), per call.

    .venv/bin/python benchmarks/harness_files.py [--calls 1000] [--env gsm8k] [--dir /dev/shm]

Writes go to a fresh folder under `--dir` (a tmpfs by default, so the disk's noise stays out). Run it with
`PYTHONPATH` pointing at two checkouts to compare them; p50 and p10 are printed in microseconds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from ecdysis.harness.manifest import load_harness
from ecdysis.workspace import seed_harness_dir


def percentiles(times: list[float]) -> str:
    times = sorted(times)
    return f"p50 {times[len(times) // 2] * 1e6:.0f} us, p10 {times[len(times) // 10] * 1e6:.0f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--env", default="gsm8k")
    parser.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    args = parser.parse_args()
    seed = seed_harness_dir(args.env)
    version = load_harness(seed)
    loads, writes = [], []
    base = Path(tempfile.mkdtemp(prefix="ecdysis-bench-", dir=args.dir))
    try:
        for i in range(args.calls):
            start = time.perf_counter()
            load_harness(seed)
            loads.append(time.perf_counter() - start)
            start = time.perf_counter()
            version.write(base / f"h{i}")
            writes.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.env} seed ({len(version.files)} files, {sum(map(len, version.files.values()))} chars)")
    print(f"load_harness:          {percentiles(loads)}")
    print(f"HarnessVersion.write:  {percentiles(writes)}")


if __name__ == "__main__":
    main()

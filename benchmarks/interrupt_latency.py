"""How long an interrupted command takes to exit while the embedded model is generating.

    .venv/bin/python benchmarks/interrupt_latency.py [--model qwen2.5-coder-1.5b] [--after 8] [--runs 3]

Starts `ecdysis chat local:MODEL "<a long count>" --max-tokens 1500`, sends SIGINT (Ctrl-C) `--after` seconds
later (the prompt processed, the reply being generated), and prints the seconds from the signal to the process's
exit, and its exit status (130 expected). Set PYTHONPATH to another checkout's `src` to measure that code.
Run it on an idle machine: llama.cpp beside another busy process is several times slower.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

PROMPT = "Count from 1 to 1000, one number per line, and nothing else."


def once(model: str, after: float) -> tuple[float, int, float]:
    """(seconds from SIGINT to exit, exit status, seconds the command had run when signalled)."""
    cmd = [sys.executable, "-m", "ecdysis", "chat", f"local:{model}", PROMPT, "--max-tokens", "1500"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    if proc.poll() is not None:
        raise SystemExit(f"the command ended before the signal ({proc.returncode}): {proc.stderr.read()[-400:]}")
    proc.send_signal(signal.SIGINT)
    signalled = time.perf_counter()
    proc.wait()
    return time.perf_counter() - signalled, proc.returncode, signalled - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--after", type=float, default=8.0, help="seconds before the SIGINT")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"model {args.model}, SIGINT after {args.after:.0f} s, code from "
          f"{os.environ.get('PYTHONPATH') or 'the installed package'}")
    exits = []
    for i in range(args.runs):
        seconds, status, ran = once(args.model, args.after)
        exits.append(seconds)
        print(f"run {i + 1}: exit {status} {seconds:.2f} s after SIGINT (signalled at {ran:.1f} s)")
    print(f"seconds to exit: min {min(exits):.2f}, median {statistics.median(exits):.2f}, max {max(exits):.2f}")


if __name__ == "__main__":
    main()

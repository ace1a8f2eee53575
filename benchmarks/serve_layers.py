"""The harness layers' own time per request in `ecdysis serve`, without HTTP or a real upstream: request
parsing, H3/H5/H4 `prepare`, H2 on the reply, queueing the recording — `Proxy.turn` with a scripted
upstream that answers at once, 16 conversations x 8 turns, one after the other.

    .venv/bin/python benchmarks/serve_layers.py [--trust-harness-code]
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_overhead import TOOL, write_harness  # noqa: E402

from ecdysis.models.base import ChatRequest, ChatResponse, Usage  # noqa: E402
from ecdysis.serve.proxy import ServeSettings  # noqa: E402
from ecdysis.serve.server import build_proxy  # noqa: E402
from ecdysis.serve.wire import ChatCompletionRequest, to_messages  # noqa: E402


class Instant:
    identity = "scripted:instant"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        arguments = {"order_id": str(len(request.messages))}  # a call written as text, a string for an integer
        return ChatResponse(text=json.dumps({"name": "lookup_order", "arguments": arguments}), usage=Usage())


async def measure(proxy) -> list[float]:  # noqa: ANN001
    times = []
    for i in range(16):
        messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"status of order {i}"}]
        for turn in range(8):
            start = time.perf_counter()
            req = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": [TOOL]})
            parsed = to_messages(req.messages)
            result = await proxy.turn(req, parsed, f"c{i}", turn == 0, turn, turn)
            proxy.record(result, parsed)
            times.append(time.perf_counter() - start)
            call = result.reply.tool_calls[0]
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "shipped " * 20})
    await proxy.harness.aclose()
    return sorted(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trust-harness-code", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proxy = build_proxy(write_harness(Path(tmp) / "h"), "scripted:instant",
                            ServeSettings(trust_harness_code=args.trust_harness_code), Path(tmp) / "store", Instant())
        times = asyncio.run(measure(proxy))
        proxy.recorder.close()
    mode = "in-process" if args.trust_harness_code else "sandboxed"
    print(f"harness code {mode}: layers per request p50 {times[len(times) // 2] * 1000:.2f} ms, "
          f"p95 {times[int(len(times) * 0.95)] * 1000:.2f} ms, mean {statistics.fmean(times) * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

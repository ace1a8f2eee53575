"""The long-prompt probe, run as a subprocess: `python -m ecdysis.doctor.probe [--model NAME] [--tokens N]`.

It prints one JSON line as soon as llama-cpp-python is imported (`{"stage": "import", "version",
"system_info"}`: the CPU features the build uses), then runs a prompt of at least N tokens (default 520;
long prompts take the batched matrix kernels that a short smoke test never reaches, e.g. AMX tiles)
through the embedded backend and prints `{"stage": "done", "prompt_tokens", "seconds"}`.

Exit status: 0 done; 3 the prompt came out shorter than N tokens; 5 the model is missing or fails its
checksum (message on stderr); 6 llama-cpp-python is not installed; a crash shows as the signal that
killed the process (SIGILL: an instruction this CPU/OS cannot run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

EXIT_SHORT, EXIT_MODEL, EXIT_NO_LLAMA = 3, 5, 6
DEFAULT_MODEL = "smollm2-135m"
MIN_TOKENS = 512

WORDS = ("harness", "prompt", "kernel", "matrix", "token", "episode", "sandbox", "model", "round", "spec",
         "critic", "analyst", "engineer", "moderator", "replay", "cache", "failure", "pattern", "lever", "test")


def long_prompt(sentences: int) -> str:
    """Plain varied text: `sentences` numbered sentences of about a dozen tokens each."""
    lines = []
    for i in range(sentences):
        picked = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8)]
        lines.append(f"{i + 1}. The {' '.join(picked)} line number {i + 1} ends here.")
    return "Read these notes and reply with one word.\n" + "\n".join(lines)


def emit(record: dict[str, object]) -> None:
    print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="catalog name or path to a .gguf")
    parser.add_argument("--tokens", type=int, default=MIN_TOKENS + 8, help="minimum prompt tokens")
    args = parser.parse_args(argv)
    from ..models.llama_local import openmp_defaults

    openmp_defaults()  # as the embedded backend runs it
    try:
        import llama_cpp
    except ImportError as exc:
        print(f"llama-cpp-python is not installed: {exc}", file=sys.stderr)
        return EXIT_NO_LLAMA
    info = llama_cpp.llama_print_system_info()
    emit({"stage": "import", "version": llama_cpp.__version__,
          "system_info": info.decode() if isinstance(info, bytes) else str(info)})
    from ..models import ChatRequest, GenerationParams, Message, ModelConfigError
    from ..models.llama_local import LlamaCppModel

    try:
        model = LlamaCppModel(args.model, n_ctx=max(2048, args.tokens * 2))
    except ModelConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_MODEL
    from ..models.llama_local import load

    llm = load(model.path, model.n_ctx).llm  # the instance `chat` uses: the prompt is sized with its tokenizer
    sentences = args.tokens // 20 + 1
    while len(llm.tokenize(long_prompt(sentences).encode())) < args.tokens:
        sentences += max(1, sentences // 8)
    request = ChatRequest(messages=[Message(role="user", content=long_prompt(sentences))],
                          params=GenerationParams(max_tokens=4, temperature=0.0))
    start = time.perf_counter()
    response = asyncio.run(model.chat(request))
    seconds = time.perf_counter() - start
    tokens = response.usage.prompt_tokens
    emit({"stage": "done", "prompt_tokens": tokens, "seconds": round(seconds, 3)})
    if tokens < args.tokens:
        print(f"the probe's prompt was {tokens} tokens, fewer than {args.tokens}", file=sys.stderr)
        return EXIT_SHORT
    return 0


if __name__ == "__main__":
    sys.exit(main())

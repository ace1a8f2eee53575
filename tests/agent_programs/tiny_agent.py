"""A tiny agent program for the tests: the plain `openai` client, one tool of its own, a loop until a text reply.

It reads its task from stdin, prints its final answer as its last line. Task prompts ask for misbehaviour by
keyword: CRASH raises, HANG sleeps past the time limit, EXIT3 exits with status 3, STEAL tries the key
left in $KEY_FILE by an earlier episode (and writes its own there), LEAK prints what it was given.
"""

import json
import os
import sys
import time

LIMITS = {"meals": 100, "travel": 500, "software": 300}
TOOLS = [{"type": "function", "function": {
    "name": "policy_limit", "description": "The spending limit in dollars for an expense category.",
    "parameters": {"type": "object", "properties": {"category": {"type": "string"}}, "required": ["category"]}}}]


def policy_limit(category: str) -> str:
    if category not in LIMITS:
        return f"Error: unknown category {category!r}; known: {', '.join(LIMITS)}"
    return f"The limit for {category} is ${LIMITS[category]}."


def main() -> None:
    task = json.loads(sys.stdin.readline())
    prompt = task["prompt"]
    if "LEAK" in prompt:  # everything it was given, as its final state
        with open(os.environ["ECDYSIS_RESULT"], "w") as f:
            json.dump({"answer": "leaked", "state": {"env": dict(os.environ), "task": task}}, f)
        return
    if "CRASH" in prompt:
        raise RuntimeError("the agent fell over")
    if "HANG" in prompt:
        time.sleep(120)
    if "EXIT3" in prompt:
        print("giving up", file=sys.stderr)
        sys.exit(3)
    import openai  # after the misbehaviours: they need no client

    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the episode
    if "STEAL" in prompt:
        path = os.environ["KEY_FILE"]
        stolen = open(path).read().strip() if os.path.exists(path) else ""
        open(path, "w").write(os.environ["OPENAI_API_KEY"])
        if not stolen:
            print("first")
        else:
            other = openai.OpenAI(api_key=stolen, max_retries=0)
            try:
                other.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
                print("reached another episode")
            except openai.AuthenticationError:
                print("denied")
        return
    messages = [{"role": "system", "content": "You review expenses. Answer approve or deny."},
                {"role": "user", "content": prompt}]
    for _ in range(6):
        reply = client.chat.completions.create(model=os.environ.get("ECDYSIS_MODEL", "any"), messages=messages,
                                               tools=TOOLS).choices[0].message
        if not reply.tool_calls:
            print(reply.content)
            return
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": policy_limit(**args)})
    print("no decision")


if __name__ == "__main__":
    main()

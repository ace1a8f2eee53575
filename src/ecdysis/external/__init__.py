"""Agent programs of their own (an OpenAI Agents SDK app, a LangGraph graph, a plain loop), trained as they are.

The agent is a command (`[agent] command`) or a Python callable (`[agent] callable`); the harness is the
endpoint it talks to. Modules: `program` (starting the program, its environment, its answer), `endpoint` (the
OpenAI-compatible server, a key per episode), `channel` (one episode's requests through the harness and its
trajectory), `layers` (the candidate harness as the endpoint applies it; the runner's model layer behind it),
`executor` (the runner's `Executor` for agent programs), `seed` (the seed harness), `call` (a callable run as a
program). The endpoint needs FastAPI and uvicorn (`pip install ecdysis[serve]`). See docs/agents.md.
"""

"""`ecdysis serve`: a frozen harness behind an OpenAI-compatible endpoint, recording what it sees.

Modules: `wire` (Chat Completions records), `layers` (the harness applied to requests and replies),
`proxy` (one turn: prepare, upstream, H2 with retries), `record` (the run store of served traffic),
`app` (FastAPI routes), `server` (build and run), `traces` (train from recorded traffic), `view`
(show/report of a serve run), `cli` (the commands). FastAPI and uvicorn come with the `serve` extra.
"""

"""Parse an SSE body (as the falcon test client returns it) into JSON chunks."""
from __future__ import annotations

import json


def sse_chunks(text: str) -> tuple[list[dict], bool, list[str]]:
    """(JSON payloads, whether [DONE] ended the stream, comment lines)."""
    chunks, comments, done = [], [], False
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert not done, "data after [DONE]"
        for line in block.splitlines():
            if line.startswith(":"):
                comments.append(line)
            elif line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[len("data: "):]))
    return chunks, done, comments


def streamed_text(chunks: list[dict], key: str = "content") -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c.get("choices"))

"""`clawmem mcp`: the memory tools over the Model Context Protocol, on stdio (`server`) or Streamable HTTP (`http`).

A front door: may use `api`, `service` and everything below. (Named `mcp` inside the package; the SDK is the
top-level `mcp`, which absolute imports keep apart.)
"""

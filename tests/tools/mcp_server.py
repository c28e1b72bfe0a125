"""A small MCP server for the tests, written with the `mcp` package: `python tests/tools/mcp_server.py` serves
over stdio, `... --http PORT` over streamable HTTP at http://127.0.0.1:PORT/mcp."""

from __future__ import annotations

import io
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("mmrl-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def swatch(color: str) -> list:
    """A 16x16 square of one color (red, green or blue), and its name."""
    from PIL import Image as PILImage

    rgb = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}[color]
    buf = io.BytesIO()
    PILImage.new("RGB", (16, 16), rgb).save(buf, format="PNG")
    return [f"a {color} swatch", Image(data=buf.getvalue(), format="png")]


@server.tool()
def fail(message: str) -> str:
    """Always fails, with `message`."""
    raise ToolError(message)


@server.tool()
def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    time.sleep(seconds)
    return "done"


@server.tool()
def crash() -> str:
    """Ends the server's process."""
    os._exit(3)


if __name__ == "__main__":
    if "--http" in sys.argv:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run()

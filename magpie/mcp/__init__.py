"""magpie's MCP server (`magpie mcp`): agents drive one project through the official SDK.

Nothing here is imported by `import magpie`: the SDK is an optional extra (`pip install
magpie[mcp]`), loaded by the verb alone. server.py builds the server; each *_tools module
registers the tools of one area; jobs.py and worker.py run long work as child processes
whose state lives in the project's workspace; confine.py keeps every path inside the project.
"""

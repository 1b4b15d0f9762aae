"""The edges: the MCP server (in), Neovim via pynvim and the memory store (out), the command line.

Nothing imports this package except the composition root (`adapters.bootstrap`) and the
`toolbus` entry point (`adapters.cli`).
"""

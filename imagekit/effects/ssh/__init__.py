"""SSH as one transport: the connection (host keys, agents, jump hosts), commands run on it, the terminal, copies both
ways, and its errors said plainly."""

"""MCP servers' tools for the model: which servers are configured (`config`), a synchronous client that holds
their sessions and calls their tools (`client`), the names the model calls them by (`names`), what a call
gives back (`results`), and the loop that runs a model's calls until it answers (`agent`)."""

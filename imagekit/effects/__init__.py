"""Effects: the only modules that touch processes, files, the network, Docker and registries."""

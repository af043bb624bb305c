"""A pod's life: connecting, running and waiting, copying, the fleet (create, start, stop, terminate, reap), the
launch check, a published image's contract."""

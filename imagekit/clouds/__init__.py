"""GPU clouds: the provider table, templates, pod creation, and the wire protocol to a pod."""

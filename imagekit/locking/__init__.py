"""What to ask the resolver, the lock format, and what may be locked (index wheels, wheel URLs, .debs, imagekit's own
wheel, the uv pin)."""

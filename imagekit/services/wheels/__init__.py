"""The locked wheels: the index's answers, the content-addressed cache, folders and direct URLs, the wheel-build
stage, and what a fetch would download."""

"""The matrix file (imagekit.toml or [tool.imagekit]), its cells, and what it becomes for CI and build engines."""

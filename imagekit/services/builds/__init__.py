"""Building an image: the stages in order, the staged steps, bases, the project's wheel, the self-test run, the
dry-run forecast, plans, the manifest, bake files, prune."""

"""One image: its plan (carrying its contract and layering), the rendered build context, layers, steps, runtime config,
names and budgets."""

"""The governor: admission decisions (budgets, concurrency, pacing, backpressure) and its actor."""

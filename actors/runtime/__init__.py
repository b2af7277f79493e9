"""The runtime the actors stand on: the actor base, futures, timers, the worker pool, nesting."""

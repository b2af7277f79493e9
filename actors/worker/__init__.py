"""What runs on the worker pool: one attempt of a provider call and the last check before it is sent."""

"""Pacing: token bucket, limit learner, circuit, send gates and the pacers shared through Redis."""

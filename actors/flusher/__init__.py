"""The completion flusher: bulk completion, the latch, and salvage of what could not be persisted."""

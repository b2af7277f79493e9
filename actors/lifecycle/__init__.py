"""The life of a call group: a plain state machine, messages in, effects out, time passed in."""

"""The tool queue actor: one per tool; grace window, dedupe, memo, and the effects of its lifecycle."""
